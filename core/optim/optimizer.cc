#define BOOST_DLL_USE_STD_FS
#include "core/optim/optimizer.h"

#include <algorithm>
#include <boost/dll/shared_library.hpp>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <set>
#include <sstream>

#include "core/comm/collectives.h"
#include "core/device/runtime.h"
#include "core/ops/gradients.h"
#include "core/ops/random.h"
#include "core/util/error.h"
#include "core/util/files.h"
#include "core/util/numbers.h"
#include "core/util/philox.h"
#include "core/util/strings.h"

namespace megabatch::optim {
namespace fs = std::filesystem;

std::vector<fs::path> plugin_search_path(const std::vector<std::string>& extra) {
  std::vector<fs::path> dirs(extra.begin(), extra.end());
  if (const char* env = std::getenv("MEGABATCH_PLUGIN_PATH")) {
    std::string s = env;
    size_t pos = 0;
    while (pos <= s.size()) {
      size_t colon = s.find(':', pos);
      if (colon == std::string::npos) colon = s.size();
      if (colon > pos) dirs.emplace_back(s.substr(pos, colon - pos));
      pos = colon + 1;
    }
  }
  if (const fs::path bin = program_dir(); !bin.empty())
    dirs.push_back((bin.parent_path() / "lib" / "megabatch" / "plugins").lexically_normal());
  return dirs;
}

std::string plugin_file_name(const std::string& name) { return "megabatch_" + name + ".so"; }

namespace {
// "[0, 0.999999999]": a schema's inclusive range, each end as written in the plugin.
std::string range_text(const mb_hparam_spec& h) {
  return "[" + shortest(h.min_value) + ", " + shortest(h.max_value) + "]";
}
}  // namespace

std::map<std::string, fs::path> available_plugins(const std::vector<fs::path>& search) {
  std::map<std::string, fs::path> found;
  for (const auto& dir : search) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string f = e.path().filename().string();
      if (f.rfind("megabatch_", 0) == 0 && f.size() > 13 && f.substr(f.size() - 3) == ".so")
        found.emplace(f.substr(10, f.size() - 13), e.path());  // first directory wins
    }
  }
  return found;
}

// A plugin's schema is what users type (--optimizer-params name=value) and what every value
// is checked against: a schema that contradicts itself is the plugin author's mistake, named
// when the plugin loads rather than met as a confusing refusal (or a default out of range
// that the plugin then gets) in someone's run.
void check_plugin_schema(const mb_plugin_entry& e, const fs::path& path) {
  std::set<std::string> seen;
  for (size_t i = 0; i < e.num_hparams; ++i) {
    const mb_hparam_spec& h = e.hparams[i];
    const std::string where = path.string() + ": plugin '" + e.name + "', hyperparameter " + std::to_string(i) + " (" +
                              (h.name ? "'" + std::string(h.name) + "'" : std::string("no name")) + ") of its schema";
    const std::string name = h.name ? h.name : "";
    check(!name.empty() && std::all_of(name.begin(), name.end(), [](unsigned char c) {
            return std::islower(c) || std::isdigit(c) || c == '_';
          }) && !std::isdigit(static_cast<unsigned char>(name[0])),
          where, ": a name is snake_case (lower-case letters, digits, '_'), as users type it in --optimizer-params NAME=VALUE");
    check(seen.insert(name).second, where, ": declared twice in the schema");
    check(h.type == MB_HPARAM_FLOAT || h.type == MB_HPARAM_INT || h.type == MB_HPARAM_BOOL, where, ": type ",
          static_cast<int>(h.type), " is none of MB_HPARAM_FLOAT, MB_HPARAM_INT, MB_HPARAM_BOOL");
    check(!std::isnan(h.min_value) && !std::isnan(h.max_value) && h.min_value <= h.max_value, where, ": range ",
          range_text(h), " is empty");
    check(std::isfinite(h.default_value) && h.default_value >= h.min_value && h.default_value <= h.max_value, where,
          ": default ", shortest(h.default_value), " is outside its range ", range_text(h));
    check(h.type != MB_HPARAM_INT || h.default_value == std::floor(h.default_value), where, ": default ",
          h.default_value, " of an int is not a whole number");
    check(h.type != MB_HPARAM_BOOL || h.default_value == 0.0 || h.default_value == 1.0, where, ": default ",
          h.default_value, " of a bool is neither 0 nor 1");
  }
}

Plugin load_plugin_file(const fs::path& path) {
  Plugin p;
  p.path = path;
  try {
    p.library = std::make_shared<boost::dll::shared_library>(
        path, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    fail(path.string(), ": cannot load the plugin library (", e.what(),
         "); rebuild it against this megabatch (cmake --build build)");
  }
  if (!p.library->has(MB_PLUGIN_ENTRY_SYMBOL))
    fail(path.string(), ": not a megabatch optimizer plugin: the symbol '", MB_PLUGIN_ENTRY_SYMBOL,
         "' is missing; define it with MEGABATCH_OPTIMIZER_PLUGIN(...) from core/optim/plugin_kit.h");
  p.entry = &p.library->get<const mb_plugin_entry>(MB_PLUGIN_ENTRY_SYMBOL);
  if (p.entry->abi_version != MB_PLUGIN_ABI_VERSION)
    fail(path.string(), ": plugin ABI version ", p.entry->abi_version, " but this megabatch speaks ABI version ",
         MB_PLUGIN_ABI_VERSION, "; rebuild the plugin against this megabatch's plugin.h");
  check(p.entry->name && p.entry->create && p.entry->step && p.entry->destroy, path.string(),
        ": plugin entry is incomplete (name, create, step and destroy are required)");
  check(p.entry->num_hparams == 0 || p.entry->hparams, path.string(), ": plugin declares ",
        p.entry->num_hparams, " hyperparameters but no schema");
  check_plugin_schema(*p.entry, path);
  return p;
}

Plugin load_plugin(const std::string& name, const std::vector<fs::path>& search) {
  const auto found = available_plugins(search);
  auto it = found.find(name);
  if (it == found.end()) {
    std::vector<std::string> names, dirs;
    for (const auto& [n, path] : found) names.push_back(n);
    for (const auto& d : search) {  // a mistyped --plugin-path shows here
      std::error_code ec;
      dirs.push_back(d.string() + (fs::is_directory(d, ec) ? "" : " (no such directory)"));
    }
    fail("unknown optimizer plugin '", name, "'", did_you_mean(name, names), "; available: ",
         names.empty() ? std::string("none") : join(names, ", "), " (searched for ", plugin_file_name(name), " in ",
         dirs.empty() ? std::string("no directories") : join(dirs, ", "),
         "; add a directory with --plugin-path or MEGABATCH_PLUGIN_PATH)");
  }
  Plugin p = load_plugin_file(it->second);
  check(name == p.entry->name, it->second.string(), ": file is named for plugin '", name,
        "' but its entry says '", p.entry->name, "'");
  return p;
}

std::string describe_hparams(const Plugin& plugin) {
  std::ostringstream os;
  const mb_plugin_entry& e = *plugin.entry;
  os << e.name << " " << (e.version ? e.version : "") << ": " << (e.description ? e.description : "") << "\n"
     << "  runs on: cpu" << ((e.devices & MB_DEVICES_CUDA) ? ", cuda" : "") << "\n";
  if (e.flags & (MB_PLUGIN_DP_SHARDS | MB_PLUGIN_WD_SCHEDULE | MB_PLUGIN_DECOUPLED_LR))
    os << "  takes:" << ((e.flags & MB_PLUGIN_DP_SHARDS) ? " --use-distributed-optimizer" : "")
       << ((e.flags & MB_PLUGIN_WD_SCHEDULE) ? " --weight-decay-incr-style" : "")
       << ((e.flags & MB_PLUGIN_DECOUPLED_LR) ? " --decoupled-lr" : "") << "\n";
  for (size_t i = 0; i < e.num_hparams; ++i) {
    const mb_hparam_spec& h = e.hparams[i];
    os << "  " << h.name << " ("
       << (h.type == MB_HPARAM_FLOAT ? "float"
           : h.type == MB_HPARAM_INT ? "int"
                                     : "bool")
       << ", default " << shortest(h.default_value) << ", range " << range_text(h) << "): " << (h.help ? h.help : "")
       << "\n";
  }
  return os.str();
}

std::vector<double> resolve_hparams(const Plugin& plugin, const nlohmann::json& values, const std::string& where) {
  const mb_plugin_entry& e = *plugin.entry;
  std::vector<double> out(e.num_hparams);
  std::vector<std::string> names;
  for (size_t i = 0; i < e.num_hparams; ++i) {
    out[i] = e.hparams[i].default_value;
    names.push_back(e.hparams[i].name);
  }
  if (values.is_null()) return out;
  check(values.is_object(), where, ": expected an object of hyperparameters for plugin '", e.name, "'");
  for (const auto& [key, v] : values.items()) {
    const int index = hparam_index(plugin, key);
    if (index < 0)
      fail(where, ".", key, ": plugin '", e.name, "' has no hyperparameter '", key, "'", did_you_mean(key, names),
           "; its hyperparameters: ", names.empty() ? std::string("none") : join(names, ", "));
    const size_t i = static_cast<size_t>(index);
    const mb_hparam_spec& h = e.hparams[i];
    double x = 0;
    if (h.type == MB_HPARAM_BOOL) {
      check(v.is_boolean(), where, ".", key, ": expected true or false, got ", v.dump());
      x = v.get<bool>() ? 1.0 : 0.0;
    } else {
      check(v.is_number(), where, ".", key, ": expected a number, got ", v.dump());
      x = v.get<double>();
      if (h.type == MB_HPARAM_INT)
        check(std::floor(x) == x, where, ".", key, ": expected an integer, got ", v.dump());
    }
    check(std::isfinite(x) && x >= h.min_value && x <= h.max_value, where, ".", key, ": ", v.dump(),
          " is out of range ", range_text(h), " for plugin '", e.name, "'");
    out[i] = x;
  }
  return out;
}

void check_takes_wd_schedule(const Plugin& plugin) {
  if (!(plugin.entry->flags & MB_PLUGIN_WD_SCHEDULE))
    fail(
        "optimizer plugin '", plugin.name(), "' (", plugin.path.string(),
        ") cannot take a weight-decay schedule (--weight-decay-incr-style): it does not declare MB_PLUGIN_WD_SCHEDULE, "
        "so it may decay by its weight_decay hyperparameter whatever the step's weight decay is; run it with a "
        "constant weight decay, or make it decay by info.weight_decay and declare the flag (core/optim/plugin.h)");
}

void check_takes_decoupled_lr(const Plugin& plugin) {
  if (!(plugin.entry->flags & MB_PLUGIN_DECOUPLED_LR))
    fail("optimizer plugin '", plugin.name(), "' (", plugin.path.string(),
         ") cannot take --decoupled-lr: it does not declare MB_PLUGIN_DECOUPLED_LR, so it may step the embedding at "
         "info.lr like every other parameter; run it without --decoupled-lr, or make it step the parameters with "
         "embedding_or_output at info.decoupled_lr and declare the flag (core/optim/plugin.h)");
}

bool embedding_or_output(const std::string& name) {
  return name == "embedding.word_embeddings.weight" || name == "output_layer.weight";
}

int hparam_index(const Plugin& plugin, const std::string& name) {
  for (size_t i = 0; i < plugin.entry->num_hparams; ++i)
    if (name == plugin.entry->hparams[i].name) return static_cast<int>(i);
  return -1;
}

nlohmann::json hparams_json(const Plugin& plugin, const std::vector<double>& values) {
  if (values.size() != plugin.entry->num_hparams)
    fail("plugin '", plugin.name(), "': ", values.size(), " hyperparameter values for a schema of ",
         plugin.entry->num_hparams);
  nlohmann::json out = nlohmann::json::object();
  for (size_t i = 0; i < values.size(); ++i) out[plugin.entry->hparams[i].name] = values[i];
  return out;
}

double grad_norm(nn::ParameterStore& store, comm::Communicator& tp, const DpShards* shards) {
  const auto sharded = shards ? shards->segments(true) : store.segments(true);
  const auto replicated = shards ? shards->segments(false) : store.segments(false);
  const Tensor sums({2}, DType::kF64, store.device());
  ops::split_sum_squares(sums, shards ? shards->grads() : store.grads(), sharded, replicated);
  if (shards) comm::all_reduce(shards->dp(), sums, comm::ReduceOp::kSum);  // the ranks' pieces
  comm::all_reduce(tp, sums.flat(0, 1), comm::ReduceOp::kSum);
  const std::vector<double> s = to_host_f64(sums);
  return std::sqrt(s[0] + s[1]);
}

namespace {
constexpr size_t kScratchAlign = 256;
size_t aligned(size_t bytes) { return (bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign; }
Tensor bytes_on(size_t bytes, Device d) {
  return Tensor({static_cast<int64_t>((bytes + 7) / 8)}, DType::kF64, d);
}
}  // namespace

PluginOptimizer::PluginOptimizer(Plugin plugin, nn::ParameterStore& store, comm::Communicator& tp,
                                 const std::vector<double>& hparams, uint64_t seed, LogSink log, DpShards* shards)
    : plugin_(std::move(plugin)), store_(&store), tp_(&tp), device_(store.device()), seed_(seed),
      log_(std::move(log)),
      shards_(shards), values_(bytes_on(sizeof(mb_step_values), device_)), norm_({1}, DType::kF64, device_),
      skip_({1}, DType::kF32, device_) {
  if (hparams.size() != plugin_.entry->num_hparams)
    fail("plugin '", plugin_.name(), "': ", hparams.size(), " hyperparameters given, ", plugin_.entry->num_hparams,
         " expected");
  if (device_.is_cuda() && !(plugin_.entry->devices & MB_DEVICES_CUDA))
    fail(
        "optimizer plugin '", plugin_.name(), "' (", plugin_.path.string(),
        ") has no GPU code: it was compiled without nvcc. Rebuild it with CUDA (in the tree: ",
        "configure megabatch where nvcc is found; out of the tree: find_package(megabatch) from a CUDA build compiles ",
        "megabatch_add_plugin sources with nvcc), or run with --device cpu");
  if (shards_ && !(plugin_.entry->flags & MB_PLUGIN_DP_SHARDS))
    fail("optimizer plugin '", plugin_.name(), "' (", plugin_.path.string(),
         ") cannot run with --use-distributed-optimizer: it does not declare ",
         "MB_PLUGIN_DP_SHARDS (its math may need whole tensors, e.g. factored state); run without the flag, or make ",
         "the plugin elementwise with per-tensor sums through sum_shards and declare it (core/optim/plugin.h)");
  if (const int k = hparam_index(plugin_, "weight_decay"); k >= 0) hparam_weight_decay_ = hparams[k];
  weight_decay_ = hparam_weight_decay_;
  for (size_t i = 0; i < store.count(); ++i) {
    const nn::ParamInfo& info = store.info(static_cast<int>(i));
    mb_param p{};
    p.name = info.name.c_str();
    p.role = static_cast<mb_role>(static_cast<int>(info.role));
    p.layer = info.layer;
    p.ndim = static_cast<int32_t>(info.shape.size());
    p.embedding_or_output = embedding_or_output(info.name) ? 1 : 0;
    for (size_t d = 0; d < info.shape.size(); ++d) {
      p.shape[d] = info.shape[d];
      p.full_shape[d] = info.full_shape[d];
    }
    p.sharded = info.sharding.sharded ? 1 : 0;
    p.partition_dim = info.sharding.partition_dim;
    p.numel = static_cast<int64_t>(info.numel);
    if (!shards_) {
      p.data = store.master(static_cast<int>(i)).data<float>();
      p.grad = store.grad(static_cast<int>(i)).data<float>();
    } else {  // this rank's piece: its masters, its reduced gradients in the shard buffer
      const Piece& piece = shards_->piece(static_cast<int>(i));
      p.numel = piece.numel();
      p.offset = piece.begin;
      p.data = shards_->master_piece(static_cast<int>(i)).data<float>();
      p.grad = shards_->grads().data<float>() + piece.at;
    }
    params_.push_back(p);
  }
  host_.ctx = this;
  host_.device = device_.is_cuda() ? MB_DEVICE_CUDA : MB_DEVICE_CPU;
  host_.device_index = device_.index;
  host_.stream = runtime::cuda_stream(device_);
  host_.alloc_state = &alloc_state;
  host_.tp_sum = &tp_sum;
  host_.sum_shards = &sum_shards;
  host_.normal = &normal;
  host_.scratch = &scratch;
  host_.alloc_device = &alloc_device;
  host_.upload = &upload;
  host_.download = &download;
  host_.metric = &metric;
  host_.log = &PluginOptimizer::log;
  char err[1024] = {0};
  creating_ = true;
  self_ = plugin_.entry->create(&host_, params_.data(), params_.size(), hparams.data(), err, sizeof err);
  creating_ = false;
  end_call();
  if (!self_)
    fail("optimizer plugin '", plugin_.name(), "' (", plugin_.path.string(), ") failed to start: ",
         host_error_.empty() ? std::string(err) : host_error_);
}

PluginOptimizer::~PluginOptimizer() {
  if (self_) plugin_.entry->destroy(self_);
}

void PluginOptimizer::set_weight_decay(double wd) {
  if (wd != hparam_weight_decay_) check_takes_wd_schedule(plugin_);
  weight_decay_ = wd;
}

void PluginOptimizer::set_decoupled_lr(double lr) {
  check_takes_decoupled_lr(plugin_);
  decoupled_lr_ = lr;
}

void PluginOptimizer::step(int64_t step_count, double lr, int64_t global_batch, double norm, bool diagnostics) {
  if (norm < 0) norm = grad_norm(*store_, *tp_, shards_);
  step(step_count, lr, global_batch, from_host(std::vector<double>{norm}, {1}), diagnostics);
}

void PluginOptimizer::step(int64_t step_count, double lr, int64_t global_batch, const Tensor& grad_norm_t,
                           bool diagnostics, const Tensor& skip) {
  if (!(grad_norm_t.dtype() == DType::kF64 && grad_norm_t.numel() == 1))
    fail("internal error: grad norm tensor ", grad_norm_t.describe());
  check(!skip.defined() || device_.is_cuda(), "internal error: a device skip flag on a CPU run");
  if (skip.defined() && (skip.dtype() != DType::kF32 || skip.numel() != 1))
    fail("internal error: skip flag ", skip.describe());
  // the step's numbers at their fixed addresses, in stream order
  const double decoupled_lr = decoupled_lr_.value_or(lr);
  const mb_step_values values{step_count, lr, global_batch, weight_decay_, decoupled_lr};
  runtime::copy_bytes(values_.raw(), device_, &values, Device::cpu(), sizeof values);  // staged: no wait
  copy(norm_, to_device(grad_norm_t, device_));
  if (skip.defined()) copy(skip_, skip);
  mb_step_info info{step_count,
                    lr,
                    global_batch,
                    seed_,
                    norm_.data<double>(),
                    diagnostics ? 1 : 0,
                    skip.defined() ? skip_.data<float>() : nullptr,
                    static_cast<const mb_step_values*>(values_.raw()),
                    weight_decay_,
                    decoupled_lr};
  if (diagnostics) diagnostics_.clear();
  collecting_ = diagnostics;
  plugin_uploads_ = 0;
  char err[1024] = {0};
  const int rc = plugin_.entry->step(self_, &info, err, sizeof err);
  collecting_ = false;
  plugin_uploads_last_ = plugin_uploads_;
  end_call();
  if (rc != 0)
    fail("optimizer plugin '", plugin_.name(), "' failed at step ", step_count, ": ", err[0] ? err : "no message");
  if (shards_) {
    shards_->all_gather_params();  // every rank's updated pieces to every rank
  } else {
    store_->copy_masters_to_params();  // mixed precision: the half weights follow the fp32 masters
  }
}

void PluginOptimizer::draw_normal(size_t index, int64_t step, float* out, size_t n) {
  const Tensor t = Tensor({static_cast<int64_t>(n)}, DType::kF32, device_);
  normal(this, index, step, t.data<float>(), n);
  runtime::read_back(out, t.raw(), device_, n * sizeof(float));
}

Tensor PluginOptimizer::device_view(void* p, size_t n, DType t) const { return Tensor::borrow(p, {static_cast<int64_t>(n)}, t, device_); }

float* PluginOptimizer::alloc_state(void* ctx, size_t index, const char* name, int32_t ndim, const int64_t* shape,
                                    int32_t partition_dim, int32_t checkpointed) {
  auto* self = static_cast<PluginOptimizer*>(ctx);
  if (!self->creating_) {
    self->host_error_ = "alloc_state called outside create()";
    return nullptr;
  }
  if (index >= self->params_.size() || !name || !*name) {
    self->host_error_ = "alloc_state: bad parameter index or empty state name";
    return nullptr;
  }
  if (ndim < 1 || ndim > 4 || !shape || partition_dim < -1 || partition_dim >= ndim) {
    self->host_error_ = std::string("alloc_state '") + name + "': 1 to 4 dimensions and a partition dimension among them (or -1)";
    return nullptr;
  }
  std::vector<int64_t> dims(shape, shape + ndim);
  for (int64_t d : dims)
    if (d < 0) {
      self->host_error_ = std::string("alloc_state '") + name + "': negative dimension";
      return nullptr;
    }
  auto key = std::make_pair(std::string(self->params_[index].name), std::string(name));
  if (self->state_.count(key)) {
    self->host_error_ = "alloc_state: state '" + key.second + "' of " + key.first + " allocated twice";
    return nullptr;
  }
  const nn::ParamInfo& info = self->store_->info(static_cast<int>(index));
  const bool piece = self->shards_ && checkpointed != 0;
  if (piece && dims != info.shape) {
    self->host_error_ = "state '" + key.second + "' of " + key.first + " has shape " + shape_text(dims) +
                        ", not its parameter's " + shape_text(info.shape) +
                        ": the distributed optimizer keeps state only for each rank's piece of a parameter; run without "
                        "--use-distributed-optimizer";
    return nullptr;
  }
  PluginState& s = self->state_[key];
  s.partition_dim = partition_dim;
  s.checkpointed = checkpointed != 0;
  if (piece) {  // this rank's piece of the parameter-shaped state
    const Piece& p = self->shards_->piece(static_cast<int>(index));
    s.piece_of = dims;
    s.piece_offset = p.begin;
    dims = {p.numel()};
  }
  s.tensor.resize(std::move(dims), DType::kF32, self->device_);
  return s.tensor.data<float>();
}

void PluginOptimizer::tp_sum(void* ctx, double* values, size_t n) {
  auto* self = static_cast<PluginOptimizer*>(ctx);
  comm::all_reduce(*self->tp_, self->device_view(values, n, DType::kF64), comm::ReduceOp::kSum);
}

void PluginOptimizer::sum_shards(void* ctx, double* values, size_t per_param) {
  auto* self = static_cast<PluginOptimizer*>(ctx);
  const size_t n = self->params_.size() * per_param;
  if (self->shards_)  // every parameter's pieces over the data-parallel group
    comm::all_reduce(self->shards_->dp(), self->device_view(values, n, DType::kF64), comm::ReduceOp::kSum);
  if (self->tp_->size() == 1) return;
  // On the device, without a trip through the host: the tensor-parallel ranks other than 0
  // zero their replicated parameters' values (which every rank holds the same), then one sum
  // over the group adds the sharded ones and leaves rank 0's replicated values as they were
  // (x + 0 is x exactly).
  if (self->tp_->rank() != 0) {
    const size_t count = self->params_.size();
    for (size_t i = 0; i < count;) {
      if (self->params_[i].sharded) {
        ++i;
        continue;
      }
      size_t end = i;
      while (end < count && !self->params_[end].sharded) ++end;  // a run of replicated parameters
      runtime::fill_zero(values + i * per_param, self->device_, (end - i) * per_param * sizeof(double));
      i = end;
    }
  }
  comm::all_reduce(*self->tp_, self->device_view(values, n, DType::kF64), comm::ReduceOp::kSum);
}

void PluginOptimizer::normal(void* ctx, size_t index, int64_t step, float* out, size_t n) {
  auto* self = static_cast<PluginOptimizer*>(ctx);
  const nn::ParamInfo& info = self->store_->info(static_cast<int>(index));
  const mb_param& p = self->params_.at(index);
  const size_t count = std::min(n, static_cast<size_t>(p.numel));
  // Keyed by (seed, step, parameter name): the same draws under any layout.
  const uint64_t key = mix_key(mix_key(self->seed_, static_cast<uint64_t>(step)),
                               name_key(info.name.data(), info.name.size()));
  ops::ShardLayout layout;
  layout.rows = info.shape[0];
  layout.cols = info.shape.size() > 1 ? info.shape[1] : 1;
  layout.full_cols = info.full_shape.size() > 1 ? info.full_shape[1] : 1;
  layout.partition_dim = info.sharding.sharded ? info.sharding.partition_dim : -1;
  layout.rank = info.sharding.tp_rank;
  layout.offset = p.offset;
  ops::normal_fill(self->device_view(out, count, DType::kF32), key, layout);
}

PluginOptimizer::State PluginOptimizer::whole_state() const {
  if (!shards_) return state_;
  State whole;
  for (const auto& [key, s] : state_) {
    if (s.piece_of.empty()) {
      whole[key] = s;
      continue;
    }
    PluginState w = s;
    w.piece_of.clear();
    w.piece_offset = 0;
    w.tensor = shards_->gather_pieces(s.tensor, s.piece_offset, s.piece_of);
    whole[key] = std::move(w);
  }
  return whole;
}

void PluginOptimizer::restore_pieces(const State& whole) {
  if (!shards_) return;
  for (auto& [key, s] : state_) {
    if (s.piece_of.empty()) continue;
    const auto it = whole.find(key);
    check(it != whole.end() && it->second.tensor.numel() == numel_of(s.piece_of), "internal error: no whole state ",
          key.second, " of ", key.first);
    copy(s.tensor, it->second.tensor.flat(static_cast<size_t>(s.piece_offset), s.tensor.numel()));
  }
}

void* PluginOptimizer::scratch(void* ctx, size_t bytes) {
  Scratch& s = static_cast<PluginOptimizer*>(ctx)->scratch_;
  const size_t size = aligned(bytes ? bytes : 1);
  const size_t capacity = s.block.defined() ? s.block.nbytes() : 0;
  void* p = nullptr;
  if (s.overflow.empty() && s.used + size <= capacity) {
    p = static_cast<char*>(s.block.raw()) + s.used;
  } else {  // this call only; end_call() makes the block hold it all
    s.overflow.push_back(bytes_on(size, static_cast<PluginOptimizer*>(ctx)->device_));
    p = s.overflow.back().raw();
  }
  s.used += size;
  return p;
}

void PluginOptimizer::end_call() {
  // Freed in stream order: the call's kernels are queued before any reuse of the memory.
  if (!scratch_.overflow.empty()) {
    scratch_.overflow.clear();
    scratch_.block = bytes_on(scratch_.used, device_);
  }
  scratch_.used = 0;
}

void* PluginOptimizer::alloc_device(void* ctx, size_t bytes) {
  auto* self = static_cast<PluginOptimizer*>(ctx);
  try {
    self->kept_.push_back(bytes_on(aligned(bytes ? bytes : 1), self->device_));
  } catch (const std::exception& e) {
    self->host_error_ = std::string("alloc_device(") + std::to_string(bytes) + " bytes): " + e.what();
    return nullptr;
  }
  return self->kept_.back().raw();
}

void PluginOptimizer::upload(void* ctx, void* device_dst, const void* host_src, size_t bytes) {
  auto* self = static_cast<PluginOptimizer*>(ctx);
  ++self->plugin_uploads_;
  runtime::copy_bytes(device_dst, self->device_, host_src, Device::cpu(), bytes);
}

void PluginOptimizer::download(void* ctx, void* host_dst, const void* device_src, size_t bytes) {
  runtime::read_back(host_dst, device_src, static_cast<PluginOptimizer*>(ctx)->device_, bytes);
}

void PluginOptimizer::metric(void* ctx, const char* series, size_t index, double value) {
  auto* self = static_cast<PluginOptimizer*>(ctx);
  if (!self->collecting_ || !series || !*series || index >= self->params_.size()) return;
  auto [it, fresh] = self->diagnostics_.try_emplace(series);
  if (fresh) it->second.assign(self->params_.size(), std::nan(""));
  it->second[index] = value;
}

void PluginOptimizer::log(void* ctx, const char* message) {
  auto* self = static_cast<PluginOptimizer*>(ctx);
  if (self->log_) self->log_(message);
}

}  // namespace megabatch::optim
