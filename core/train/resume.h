// Where a run starts: from scratch, from the checkpoint --load names (resumed, or
// --finetune: the weights only, from iteration 0; --no-load-optim: without the optimizer's
// state), or, when --load holds none, from the weights of --pretrained-checkpoint at iteration
// 0 (and its optimizer's state, with --pretrained-optimizer-state). A damaged checkpoint is
// refused naming the file and the tensor, offering the newest intact one, which
// --load-fallback takes.
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
#include "core/optim/schedule.h"

namespace megabatch::train {

// The checkpoint `load` names: the file itself, or the newest in a directory (nullopt when
// it has none); a damaged one as above (the fallback taken is said on `console`). `flag` is
// the option that named `load`, for the advice in an error; --pretrained-checkpoint takes no
// fallback.
std::optional<std::filesystem::path> intact_checkpoint(const std::filesystem::path& load, bool fallback,
                                                       std::ostream& console, const std::string& flag = "--load");

// The checkpointing options that say where a run starts.
struct LoadOptions {
  std::string load;        // --load: this run's checkpoints, a directory or a file; "": none
  std::string pretrained;  // --pretrained-checkpoint: the weights a first start takes; "": none
  bool fallback = false;   // --load-fallback
  bool finetune = false;   // --finetune: --load's weights only, from iteration 0
  bool no_load_optim = false;
  bool pretrained_optimizer = false;  // --pretrained-optimizer-state: the first start takes its optimizer state too
  bool exit_on_missing = false;       // --exit-on-missing-checkpoint: --load without a checkpoint is an error
  std::optional<int64_t> ckpt_step;   // --ckpt-step: this iteration's checkpoint of the --load directory
};

struct ResumePoint {
  std::optional<std::filesystem::path> from;  // the checkpoint, if any
  io::CheckpointState state;                   // its header (iteration, samples, seed, trainer state)
  bool finetune = false, no_load_optim = false;        // finetune: the weights only (--pretrained-checkpoint too)
  bool pretrained_optimizer = false;                   // a first start from --pretrained-checkpoint: and its
                                                       // optimizer state (iteration 0, the step count from 1)
  bool resuming() const { return from && !finetune; }  // continues the iterations and the data
  // takes the checkpoint's optimizer state (resuming without --no-load-optim, or
  // --pretrained-optimizer-state)
  bool loads_optimizer() const { return (!finetune && !no_load_optim) || pretrained_optimizer; }
};

// The checkpoint a run with these options takes its weights from, by name alone (nothing is
// read, none is checked): --load's (--ckpt-step's, the file it names, or its newest), else
// --pretrained-checkpoint's; nullopt where there is none.
std::optional<std::filesystem::path> checkpoint_to_load(const LoadOptions& how);

// Where this run starts, checked against its seed and --train-iters: a resumed run keeps its
// seed and does not start past its end; a --pretrained-checkpoint (or --finetune) directory
// that holds no checkpoint is refused, as a wrong path. With verify (the run), the checkpoint
// is read whole first, and a damaged one is refused or falls back (intact_checkpoint); without
// (train --check), the newest is taken by its header alone.
ResumePoint find_resume_point(const LoadOptions& how, uint64_t seed, int64_t train_iters, std::ostream& console,
                              bool verify = true);

// What a resumed run does with the learning-rate and weight-decay schedule its checkpoint
// was trained with when its own flags give another one, as Megatron's OptimizerParamScheduler
// does: refuse (the default: a resumed run whose --lr, decay span or weight decay changed by
// mistake would go on with another schedule unseen), take the run's flags
// (--override-opt-param-scheduler) or the checkpoint's (--use-checkpoint-opt-param-scheduler).
enum class ScheduleOnResume { kCheck, kOverride, kFromCheckpoint };

// The schedule a run resuming from `point` steps with: `run` (its flags') where the
// checkpoint's agrees in every setting that moves the learning rate under its decay style
// (a constant schedule has no decay span to disagree on) and the weight decay, or has none
// saved (a checkpoint from before weight-decay schedules: the LR alone); else as `how`
// says, the choice said on `console`. An Error names both values of each setting that differs
// and the two flags.
optim::LrSchedule schedule_on_resume(const ResumePoint& point, const optim::LrSchedule& run, ScheduleOnResume how,
                                     std::ostream& console);

// What loading `point`'s checkpoint would refuse, before anything is loaded (train --check, and
// so sweep run --dry-run, says it too): its model's vocabulary (check_checkpoint_vocabulary),
// its optimizer state's plugin where the run takes that state (resuming without
// --no-load-optim, or --pretrained-optimizer-state), and its parameters' names and shapes
// against `params` (io::check_checkpoint_matches; a declared model's will do), and what its
// model's settings say the stored weights mean against `model`, the run's (as the checkpoint's
// "model" records it): norm weights stored as 1 + w or as w (--apply-layernorm-1p), the
// activation, the blocks' order, the rotary channels and the count of attention heads, which
// names and shapes cannot tell. The tensors' checksums are checked when it loads.
void check_checkpoint_fits(const ResumePoint& point, const nn::ParameterStore& params, int64_t vocab_size,
                           const nlohmann::json& tokenizer, const std::string& plugin, int64_t padded_vocab,
                           const nlohmann::json& model);

// A resumed run's training data (apps' training_data_record) against its checkpoint's: the data
// position it resumes at counts samples of that data, so other datasets, another split of them,
// other weights or another sample length would go on with other samples than the uninterrupted
// run's. An Error naming both, the datasets' prefixes aside (a dataset moved is the same);
// nothing where the run does not resume (--finetune, --pretrained-checkpoint: a data position of
// its own) or the checkpoint has no record (written before it).
void check_checkpoint_data(const ResumePoint& point, const nlohmann::json& data);

// A checkpoint's model (its header's "model") against this run's vocabulary: `vocab_size` tokens
// and, where the checkpoint names its tokenizer, the same tokens (`tokenizer`: the run's, as
// checkpoint_tokenizer gives it). An Error naming `file` otherwise.
void check_checkpoint_vocabulary(const std::filesystem::path& file, const nlohmann::json& model, int64_t vocab_size,
                                 const nlohmann::json& tokenizer);

// Loads the checkpoint's parameters (and, resuming or with --pretrained-optimizer-state, the
// optimizer's state) into the run.
// Checkpoints hold whole tensors: with `shards` (the distributed optimizer) this rank takes
// its pieces of the state and of the fp32 masters. The checkpoint's model must have the run's
// vocabulary: `vocab_size` tokens and, where the checkpoint names its tokenizer, the same
// tokens (`tokenizer`: the run's, as checkpoint_tokenizer gives it); its padding may differ
// from `padded_vocab`.
void load_resume_point(const ResumePoint& point, nn::ParameterStore& params, optim::PluginOptimizer& optimizer,
                       optim::DpShards* shards, int64_t vocab_size, const nlohmann::json& tokenizer,
                       int64_t padded_vocab, const nlohmann::json& model, std::ostream& console);

// What a checkpoint's model says of the tokenizer its embedding rows stand for: its type and
// the fingerprint of its vocabulary (data/tokenizer_record.h), T5's sentinels aside.
nlohmann::json checkpoint_tokenizer(const data::Tokenizer& tokenizer);

}  // namespace megabatch::train
