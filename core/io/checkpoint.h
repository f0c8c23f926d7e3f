// HDF5 checkpoints: everything needed to continue a run exactly.
//
//   DIR/iter_0000100.h5                 one checkpoint per saved iteration
//   DIR/latest_checkpointed_iteration.txt   the newest complete one (Megatron's file name)
//
// A checkpoint holds every parameter by name in its full (unsharded) shape with its role
// and sharding as attributes (params/<name>), the optimizer plugin's state by parameter
// and state name (optimizer/<param>/<state>, full shape), and as root attributes the
// iteration, consumed samples (which is the data loader's position: sample order is a
// pure function of the seed), the seed (dropout and noise are keyed by seed and
// iteration, so this is the whole RNG state), the loss scale, the model configuration,
// the optimizer plugin's name, version and hyperparameters, and the trainer's own state.
//
// Every tensor is stored in chunks that carry HDF5's Fletcher-32 checksum, and the file's
// metadata the checksums of HDF5 1.10's format: every read verifies them, so a file damaged
// after it was written is refused naming the file and the tensor (checkpoint_damage reads
// a whole file that way, to choose one before loading it).
//
// Writing goes to iter_N.h5.tmp, which is flushed, fsync'ed and renamed; only then is the
// latest file replaced (also atomically). A kill at any moment leaves the previous
// checkpoint complete and named by the latest file. Because shards are stored whole, a
// checkpoint written at one tensor-parallel size loads at any other.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/comm/communicator.h"
#include "core/nn/parameters.h"
#include "core/optim/state.h"
#include "core/tensor/tensor.h"

namespace megabatch::io {

struct CheckpointState {
  std::filesystem::path file;        // where it was read from (empty when it is being written)
  int64_t iteration = 0;
  int64_t consumed_samples = 0;
  uint64_t seed = 0;
  double loss_scale = 1.0;
  nlohmann::json model;              // the model configuration (checked on load); "tokenizer": its
                                     // type and vocab_fingerprint (data/tokenizer_record.h), where written
  std::string optimizer;             // plugin name
  std::string optimizer_version;
  nlohmann::json optimizer_params;   // resolved hyperparameters
  nlohmann::json trainer;            // the trainer's own state (noise-scale averages, ...)
  nlohmann::json data;               // what the training samples are drawn from (datasets, split,
                                     // weights, sample length); null in a checkpoint from before it
  bool checksummed = true;           // written with checksums (format 2); format 1 had none
};

// What a refused attribute's message ends with: a checkpoint this code wrote has every
// field right, so a wrong one was edited by hand or damaged on disk.
inline constexpr const char* kDamagedCheckpoint =
    "; the file was edited or damaged: move it away (and remove latest_checkpointed_iteration.txt) to resume from "
    "the newest checkpoint left";

// Optimizer state by (parameter name, state name), as PluginOptimizer keeps it.
using OptimizerState = optim::OptimizerState;

std::filesystem::path checkpoint_path(const std::filesystem::path& dir, int64_t iteration);
// The iter_NNNNNNN.h5 files of dir by iteration, oldest first (none where dir is missing).
std::vector<std::pair<int64_t, std::filesystem::path>> list_checkpoints(const std::filesystem::path& dir);
// Removes what killed or failed writes left in dir: iter_NNNNNNN.h5.tmp and
// latest_checkpointed_iteration.txt.tmp, nothing else (no other file, no symlink).
void remove_unfinished_checkpoints(const std::filesystem::path& dir);

// The directory of a checkpoint directory into which set_aside_later_checkpoints moves the
// checkpoints past a rewind or a fresh start, as dir/earlier/N.
inline constexpr const char* kSetAsideDir = "earlier";

// Which checkpoints of a directory stay: the newest `newest`, and those of iterations that are
// multiples of `every` (Megatron's --save-retain-interval; 0: none besides the newest); with
// `set_aside`, none of those set aside in dir/earlier/N (set_aside_later_checkpoints) stays.
struct Kept {
  int newest = 0;
  int64_t every = 0;
  bool set_aside = false;
};

// Removes the iter_NNNNNNN.h5 in dir that `kept` does not keep (regular files only, never
// through a symlink; with kept.set_aside, those in dir/earlier/N too, and each directory that
// leaves empty); kept.newest <= 0 removes latest_checkpointed_iteration.txt too. Returns the
// bytes freed.
int64_t remove_old_checkpoints(const std::filesystem::path& dir, Kept kept);
// The bytes remove_old_checkpoints(dir, kept) would free; removes nothing.
int64_t old_checkpoint_bytes(const std::filesystem::path& dir, Kept kept);

// Moves the checkpoints of `dir` past `iteration` into dir/earlier/N (the first N free), for a
// run that starts at `iteration` and saves there: they are another trajectory's (a rewind to
// an earlier checkpoint, or a run started afresh), which its --keep-checkpoints would keep
// over its own, and a resume after a lost latest file would take for its own. The latest file
// then names the newest left, or is removed. Returns the iterations moved (none: nothing done)
// and where to.
struct SetAside {
  std::vector<int64_t> iterations;
  std::filesystem::path to;
  int64_t bytes = 0;  // of the files moved
};
SetAside set_aside_later_checkpoints(const std::filesystem::path& dir, int64_t iteration);

// The newest complete checkpoint in dir: the one latest_checkpointed_iteration.txt names,
// or (when that file is missing) the highest iter_*.h5. nullopt when there is none.
std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& dir);

// Writes a checkpoint of the parameters' fp32 masters (gathered over the tensor-parallel
// group; rank 0 writes) and, when given, the optimizer state, then keeps what `kept` says
// (kept.newest 0: all). Returns the checkpoint's path. Errors name the file (disk full,
// ...). `masters`, when given, are the whole (TP-local) masters by parameter id where the
// store does not hold them (the distributed optimizer's: optim::DpShards::whole_masters()).
std::filesystem::path save_checkpoint(const std::filesystem::path& dir, const CheckpointState& state,
                                      nn::ParameterStore& store, comm::Communicator& tp,
                                      const OptimizerState* optimizer, Kept kept,
                                      const std::vector<Tensor>* masters = nullptr);

// The root attributes of a checkpoint.
CheckpointState read_checkpoint_state(const std::filesystem::path& file);

// What is wrong with a checkpoint file, as an error message that names the file and the
// attribute or tensor (missing, unreadable, failing its checksum), or nullopt when all of
// it reads back intact. Reads every tensor.
std::optional<std::string> checkpoint_damage(const std::filesystem::path& file);

// The newest iter_NNNNNNN.h5 in dir below `before_iteration` that checkpoint_damage finds
// intact; nullopt when there is none.
std::optional<std::filesystem::path> newest_intact_checkpoint(const std::filesystem::path& dir, int64_t before_iteration);

// The iteration in a checkpoint's file name (iter_NNNNNNN.h5), or nullopt for another name.
std::optional<int64_t> checkpoint_iteration(const std::filesystem::path& file);

// Whether load_checkpoint would take the checkpoint: it holds the store's parameters, each of
// its names, no other, each of its full shape (a padded vocabulary's rows may differ as there),
// and, where `expected_optimizer` is not empty, optimizer state of that plugin; an Error as
// load_checkpoint's otherwise. Attributes and the datasets' headers only (nothing is read or
// allocated): `store` may be a declared model's, not finalized (train --check). `run_model`,
// where given (models::model_json of the run's), names the settings that differ in a refusal.
void check_checkpoint_matches(const std::filesystem::path& file, const nn::ParameterStore& store,
                              const std::string& expected_optimizer, int64_t expected_padded_vocab = -1,
                              const nlohmann::json& run_model = nlohmann::json());

// Loads every parameter (each shard its slice of the stored full tensor) and, when
// `optimizer` is given, its state, refusing with a message that names the mismatch: a
// parameter missing on either side or of another shape, optimizer state from another
// plugin (`expected_optimizer`) or missing a buffer. Tensors with one row per padded
// vocabulary entry may differ in their padding (the vocabulary is padded to a multiple of
// 128 x TP, so a checkpoint written at TP 2 has more rows than the model at TP 1): given
// this run's padded vocabulary, the rows both have are loaded and the rest keep their
// values. With `masters` (whole masters by parameter id, as for save_checkpoint) the
// parameters are loaded into those, for the caller to restore
// (optim::DpShards::restore_masters), and the store is left as it was.
void load_checkpoint(const std::filesystem::path& file, nn::ParameterStore& store, OptimizerState* optimizer,
                     const std::string& expected_optimizer, int64_t expected_padded_vocab = -1,
                     std::vector<Tensor>* masters = nullptr, const nlohmann::json& run_model = nlohmann::json());

}  // namespace megabatch::io
