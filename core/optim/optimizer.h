// The host side of optimizer plugins: finding and loading a plugin library with
// Boost.DLL, checking its ABI version and hyperparameters, and driving its optimizer
// over the run's parameters with host-owned state.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/comm/communicator.h"
#include "core/device/runtime.h"
#include "core/nn/parameters.h"
#include "core/optim/dp_shards.h"
#include "core/optim/plugin.h"
#include "core/optim/state.h"
#include "core/tensor/tensor.h"

namespace boost::dll {
class shared_library;
}

namespace megabatch::optim {

// A loaded plugin library. Copies share the library handle; the library stays loaded
// while any copy, or any optimizer created from it, lives.
struct Plugin {
  std::shared_ptr<boost::dll::shared_library> library;
  const mb_plugin_entry* entry = nullptr;
  std::filesystem::path path;
  std::string name() const { return entry->name; }
};

// Directories searched, in order: `extra` (--plugin-path), $MEGABATCH_PLUGIN_PATH
// (colon-separated), and <dir of this program>/../lib/megabatch/plugins.
std::vector<std::filesystem::path> plugin_search_path(const std::vector<std::string>& extra = {});
// The file a plugin named `name` lives in: megabatch_<name>.so.
std::string plugin_file_name(const std::string& name);
// Plugins found on the search path: name -> file.
std::map<std::string, std::filesystem::path> available_plugins(const std::vector<std::filesystem::path>& search);
// Loads plugin `name` from the search path. Errors: unknown name (listing those
// available and where they were searched), missing entry symbol, wrong ABI version
// (both versions named), entry name differing from the file name, a schema at odds with
// itself (check_plugin_schema).
Plugin load_plugin(const std::string& name, const std::vector<std::filesystem::path>& search);
Plugin load_plugin_file(const std::filesystem::path& path);
// A plugin's hyperparameter schema, as the loader checks it: snake_case names declared once,
// a known type, a non-empty range holding the default, whole-number ints, 0/1 bools. Throws
// naming `path`, the plugin and the entry.
void check_plugin_schema(const mb_plugin_entry& entry, const std::filesystem::path& path);

// Hyperparameters in schema order from a JSON object {name: value}; missing ones take
// the schema default. Errors name `where` (e.g. "optimizer_params") and the key: unknown
// name (with the nearest and the schema), wrong type, out of range.
std::vector<double> resolve_hparams(const Plugin& plugin, const nlohmann::json& values, const std::string& where);
// An Error naming the plugin unless it declares MB_PLUGIN_WD_SCHEDULE: only such a plugin
// decays by the step's weight decay, which a schedule moves.
void check_takes_wd_schedule(const Plugin& plugin);
// An Error naming the plugin unless it declares MB_PLUGIN_DECOUPLED_LR: only such a plugin
// steps the embedding at the step's decoupled lr.
void check_takes_decoupled_lr(const Plugin& plugin);
// Megatron's is_embedding_or_output_parameter, by the parameter's name: the input word
// embeddings (which the output layer shares in every model here) or an output layer of its own.
bool embedding_or_output(const std::string& name);
// The position of hyperparameter `name` in the plugin's schema, or -1 when it has none.
int hparam_index(const Plugin& plugin, const std::string& name);
// Values in schema order (from resolve_hparams) as a JSON object {name: value}.
nlohmann::json hparams_json(const Plugin& plugin, const std::vector<double>& values);
// The schema as text (for --help and error messages).
std::string describe_hparams(const Plugin& plugin);

// Global L2 norm of all gradients: squared norms of sharded tensors are summed over the
// tensor-parallel group, replicated tensors are counted once. With `shards` (the
// distributed optimizer) the norm of the reduced gradients in the shards, summed over DP.
double grad_norm(nn::ParameterStore& store, comm::Communicator& tp, const DpShards* shards = nullptr);

// A plugin optimizer bound to the parameters of a ParameterStore (their fp32 masters and
// fp32 gradients, on the store's device).
class PluginOptimizer {
 public:
  using LogSink = std::function<void(const std::string&)>;
  // Per-tensor diagnostics of one step: series -> one value per parameter (NaN where
  // the plugin reported none).
  using Diagnostics = std::map<std::string, std::vector<double>>;
  using State = OptimizerState;

  // Errors: a plugin without device code on a GPU run (naming it and how to rebuild it),
  // a plugin that fails to start. With `shards` (the distributed optimizer) the plugin
  // steps this rank's pieces of the parameters, with their gradients from shards->grads(),
  // keeps state for the pieces only, and step() all-gathers the parameters afterwards; a
  // plugin that does not declare MB_PLUGIN_DP_SHARDS is refused.
  PluginOptimizer(Plugin plugin, nn::ParameterStore& store, comm::Communicator& tp, const std::vector<double>& hparams,
                  uint64_t seed, LogSink log = {}, DpShards* shards = nullptr);
  ~PluginOptimizer();
  PluginOptimizer(const PluginOptimizer&) = delete;
  PluginOptimizer& operator=(const PluginOptimizer&) = delete;

  // One step; an Error carrying the plugin's message when it fails. grad_norm is the
  // global norm of the current gradients when the caller knows it (the trainer does,
  // after clipping); a negative value makes the host compute it. With diagnostics set,
  // the plugin reports per-tensor diagnostics, available from diagnostics() afterwards.
  void step(int64_t step, double lr, int64_t global_batch, double grad_norm = -1.0, bool diagnostics = false);
  // The same with the global norm as a one-element f64 tensor on the run's device (the
  // trainer's, which never leaves the device) and, on a GPU, the fp16 overflow flag (f32,
  // on the device; undefined: none): when it is set the step's kernels change nothing.
  void step(int64_t step, double lr, int64_t global_batch, const Tensor& grad_norm, bool diagnostics,
            const Tensor& skip = {});
  // The weight decay the following steps hand the plugin (info.weight_decay): at first the
  // plugin's weight_decay hyperparameter (0 when it has none); a schedule sets each step's.
  // An Error naming the plugin when it does not declare MB_PLUGIN_WD_SCHEDULE and `wd`
  // differs from its hyperparameter (it would go on decaying by that, unseen).
  void set_weight_decay(double wd);
  double weight_decay() const { return weight_decay_; }
  // The learning rate of the embedding_or_output parameters in the following steps
  // (info.decoupled_lr): the step's lr until this is called (Megatron's --decoupled-lr sets
  // each step's). An Error naming the plugin when it does not declare MB_PLUGIN_DECOUPLED_LR.
  void set_decoupled_lr(double lr);
  // The standard normal draws the host gives the plugin for (parameter index, step):
  // out[0..n) (host memory) of the local shard, keyed by the element's index in the full tensor.
  void draw_normal(size_t index, int64_t step, float* out, size_t n);
  // Uploads the plugin asked for during the last step (host->upload calls). The shipped
  // plugins make none once their job tables are on the device (from the third step on).
  int64_t plugin_uploads_last_step() const { return plugin_uploads_last_; }
  // What the last step with diagnostics reported.
  const Diagnostics& diagnostics() const { return diagnostics_; }
  const Plugin& plugin() const { return plugin_; }
  // Optimizer state by (parameter name, state name), as this rank keeps it (pieces with
  // the distributed optimizer).
  const State& state() const { return state_; }
  State& state() { return state_; }
  // The state with whole (TP-local) tensors, for checkpoints: the pieces are gathered over
  // the data-parallel group (every DP rank calls it); without shards, state() itself.
  State whole_state() const;
  // Takes this rank's pieces from whole tensors (as whole_state() gives them, loaded from
  // a checkpoint written at any data-parallel size); without shards, nothing to do.
  void restore_pieces(const State& whole);
  DpShards* shards() const { return shards_; }

 private:
  static float* alloc_state(void* ctx, size_t index, const char* name, int32_t ndim, const int64_t* shape,
                            int32_t partition_dim, int32_t checkpointed);
  static void tp_sum(void* ctx, double* values, size_t n);
  static void sum_shards(void* ctx, double* values, size_t per_param);
  static void normal(void* ctx, size_t index, int64_t step, float* out, size_t n);
  static void* scratch(void* ctx, size_t bytes);
  static void* alloc_device(void* ctx, size_t bytes);
  static void upload(void* ctx, void* device_dst, const void* host_src, size_t bytes);
  static void download(void* ctx, void* host_dst, const void* device_src, size_t bytes);
  static void metric(void* ctx, const char* series, size_t index, double value);
  static void log(void* ctx, const char* message);
  Tensor device_view(void* p, size_t n, DType t) const;  // a tensor over memory the plugin holds

  Plugin plugin_;
  nn::ParameterStore* store_;
  comm::Communicator* tp_;
  Device device_;
  uint64_t seed_;
  double hparam_weight_decay_ = 0, weight_decay_ = 0;  // the plugin's hyperparameter; the steps' value
  std::optional<double> decoupled_lr_;                 // none: the step's lr
  Diagnostics diagnostics_;
  bool collecting_ = false;
  LogSink log_;
  DpShards* shards_ = nullptr;
  std::vector<mb_param> params_;
  State state_;
  // host->scratch: one block, handed out in order and rewound after each call; what does
  // not fit comes from `overflow` this time and makes the block large enough for the next,
  // so the same requests get the same addresses step after step.
  struct Scratch {
    Tensor block;
    size_t used = 0;
    std::vector<Tensor> overflow;
  };
  void end_call();  // rewinds the scratch (growing it when it overflowed)
  Scratch scratch_;
  std::vector<Tensor> kept_;  // host->alloc_device: lives as long as the optimizer
  // info.values, info.grad_norm and info.skip: at one address for the whole run
  Tensor values_, norm_, skip_;
  int64_t plugin_uploads_ = 0, plugin_uploads_last_ = 0;
  bool creating_ = false;
  std::string host_error_;
  mb_host host_{};
  void* self_ = nullptr;
};

}  // namespace megabatch::optim
