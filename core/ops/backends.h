// The backends of the op API: ops::cpu (the reference, in cpu/) and ops::cuda (in cuda/,
// compiled in CUDA builds only and reached through MB_CUDA). Each implements every entry
// point listed in backend_ops.inc. Only the dispatching op files include this, and the
// tests that run cuda/'s code on the CPU's warp emulator (ops::emulated, tests/emulator).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "core/ops/activation.h"
#include "core/ops/attention.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/dropout.h"
#include "core/ops/elementwise.h"
#include "core/ops/embedding.h"
#include "core/ops/flash_attention.h"
#include "core/ops/gather.h"
#include "core/ops/gradients.h"
#include "core/ops/layernorm.h"
#include "core/ops/matmul.h"
#include "core/ops/random.h"
#include "core/ops/reduce.h"
#include "core/ops/relative_position.h"
#include "core/ops/residual.h"
#include "core/ops/rotary.h"

namespace megabatch::ops::cpu {
#include "core/ops/backend_ops.inc"
}  // namespace megabatch::ops::cpu

namespace megabatch::ops::cuda {
#include "core/ops/backend_ops.inc"
// The compute capability (major x 10 + minor) that the flash kernels were compiled for, as
// they run on GPU `device`: its own, or an older one's whose PTX the driver compiled for it
// (a build for sm_75 alone run on a newer GPU: how the T4 path is tested on an H100).
int flash_code_arch(int device);
}  // namespace megabatch::ops::cuda

// cuda/'s kernels compiled as C++ for the warp emulator (MB_WARP_EMULATOR; defined only in
// the test programs of tests/emulator)
namespace megabatch::ops::emulated {
#include "core/ops/backend_ops.inc"
}  // namespace megabatch::ops::emulated
