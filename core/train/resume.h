// Where a run starts: from scratch, or from the checkpoint --load names (resumed, or
// --finetune: the weights only, from iteration 0; --no-load-optim: without the optimizer's
// state). A damaged checkpoint is refused naming the file and the tensor, offering the
// newest intact one, which --load-fallback takes.
#pragma once

#include <filesystem>
#include <iosfwd>
#include <optional>
#include <string>

#include "core/data/tokenizer.h"
#include "core/io/checkpoint.h"
#include "core/nn/parameters.h"
#include "core/optim/dp_shards.h"
#include "core/optim/optimizer.h"

namespace megabatch::train {

// The checkpoint `load` names: the file itself, or the newest in a directory (nullopt when
// it has none); a damaged one as above (the fallback taken is said on `console`).
std::optional<std::filesystem::path> intact_checkpoint(const std::filesystem::path& load, bool fallback,
                                                      std::ostream& console);

struct ResumePoint {
  std::optional<std::filesystem::path> from;  // the checkpoint, if any
  io::CheckpointState state;                   // its header (iteration, samples, seed, trainer state)
  bool finetune = false, no_load_optim = false;
  bool resuming() const { return from && !finetune; }  // continues the iterations and the data
};

// --load (empty: none), --load-fallback, --finetune, --no-load-optim against this run's seed
// and --train-iters: a resumed run keeps its seed and does not start past its end.
ResumePoint find_resume_point(const std::string& load, bool fallback, bool finetune, bool no_load_optim, uint64_t seed,
                              int64_t train_iters, std::ostream& console);

// Loads the checkpoint's parameters (and, resuming, the optimizer's state) into the run.
// Checkpoints hold whole tensors: with `shards` (the distributed optimizer) this rank takes
// its pieces of the state and of the fp32 masters. The checkpoint's model must have the run's
// vocabulary: `vocab_size` tokens and, where the checkpoint names its tokenizer, the same
// tokens (`tokenizer`: the run's, as checkpoint_tokenizer gives it); its padding may differ
// from `padded_vocab`.
void load_resume_point(const ResumePoint& point, nn::ParameterStore& params, optim::PluginOptimizer& optimizer,
                       optim::DpShards* shards, int64_t vocab_size, const nlohmann::json& tokenizer,
                       int64_t padded_vocab, std::ostream& console);

// What a checkpoint's model says of the tokenizer its embedding rows stand for: its type and
// the fingerprint of its vocabulary (data/tokenizer_record.h), T5's sentinels aside.
nlohmann::json checkpoint_tokenizer(const data::Tokenizer& tokenizer);

}  // namespace megabatch::train
