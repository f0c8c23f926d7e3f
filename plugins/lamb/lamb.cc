// lamb: LAMB with NVIDIA Apex FusedLAMB's semantics (see lamb.h).
#include "lamb.h"

namespace {
const mb_hparam_spec kSchema[] = {MEGABATCH_LAMB_HPARAMS};
}  // namespace

MEGABATCH_OPTIMIZER_PLUGIN(megabatch::plugins::Lamb, "lamb", "1.2.0",
                           "LAMB with Apex FusedLAMB semantics (per-tensor trust ratio, optional NVLAMB)", kSchema)
