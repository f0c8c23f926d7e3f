#define BOOST_DLL_USE_STD_FS
#include "core/optim/optimizer.h"

#include <boost/dll/shared_library.hpp>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "core/util/error.h"
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
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) dirs.push_back((exe.parent_path().parent_path() / "lib" / "megabatch" / "plugins").lexically_normal());
  return dirs;
}

std::string plugin_file_name(const std::string& name) { return "megabatch_" + name + ".so"; }

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
         "' is missing; define it with MEGABATCH_OPTIMIZER_PLUGIN(...) from core/optim/plugin.h");
  p.entry = &p.library->get<const mb_plugin_entry>(MB_PLUGIN_ENTRY_SYMBOL);
  if (p.entry->abi_version != MB_PLUGIN_ABI_VERSION)
    fail(path.string(), ": plugin ABI version ", p.entry->abi_version, " but this megabatch speaks ABI version ",
         MB_PLUGIN_ABI_VERSION, "; rebuild the plugin against this megabatch's plugin.h");
  check(p.entry->name && p.entry->create && p.entry->step && p.entry->destroy, path.string(),
        ": plugin entry is incomplete (name, create, step and destroy are required)");
  check(p.entry->num_hparams == 0 || p.entry->hparams, path.string(), ": plugin declares ",
        p.entry->num_hparams, " hyperparameters but no schema");
  return p;
}

Plugin load_plugin(const std::string& name, const std::vector<fs::path>& search) {
  const auto found = available_plugins(search);
  auto it = found.find(name);
  if (it == found.end()) {
    std::vector<std::string> names, dirs;
    for (const auto& [n, path] : found) names.push_back(n);
    for (const auto& d : search) dirs.push_back(d.string());
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
  os << e.name << " " << (e.version ? e.version : "") << ": " << (e.description ? e.description : "") << "\n";
  for (size_t i = 0; i < e.num_hparams; ++i) {
    const mb_hparam_spec& h = e.hparams[i];
    os << "  " << h.name << " (" << (h.type == MB_HPARAM_FLOAT ? "float" : h.type == MB_HPARAM_INT ? "int" : "bool")
       << ", default " << h.default_value << ", range [" << h.min_value << ", " << h.max_value << "]): "
       << (h.help ? h.help : "") << "\n";
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
    size_t i = 0;
    while (i < e.num_hparams && key != e.hparams[i].name) ++i;
    if (i == e.num_hparams)
      fail(where, ".", key, ": plugin '", e.name, "' has no hyperparameter '", key, "'", did_you_mean(key, names),
           "; its hyperparameters: ", names.empty() ? std::string("none") : join(names, ", "));
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
          " is out of range [", h.min_value, ", ", h.max_value, "] for plugin '", e.name, "'");
    out[i] = x;
  }
  return out;
}

double grad_norm(nn::ParameterStore& store, comm::Communicator& tp) {
  double sharded = 0, replicated = 0;
  for (size_t i = 0; i < store.count(); ++i) {
    const auto& info = store.info(static_cast<int>(i));
    const float* g = store.grad(static_cast<int>(i)).data<float>();
    double s = 0;
#pragma omp parallel for reduction(+ : s) schedule(static) if (info.numel > 65536)
    for (int64_t j = 0; j < static_cast<int64_t>(info.numel); ++j) s += static_cast<double>(g[j]) * g[j];
    (info.sharding.sharded ? sharded : replicated) += s;
  }
  tp.all_reduce(&sharded, 1, comm::ReduceOp::kSum);
  return std::sqrt(sharded + replicated);
}

PluginOptimizer::PluginOptimizer(Plugin plugin, nn::ParameterStore& store, comm::Communicator& tp,
                                 const std::vector<double>& hparams, uint64_t seed, LogSink log)
    : plugin_(std::move(plugin)), store_(&store), tp_(&tp), seed_(seed), log_(std::move(log)) {
  check(hparams.size() == plugin_.entry->num_hparams, "plugin '", plugin_.name(), "': ", hparams.size(),
        " hyperparameters given, ", plugin_.entry->num_hparams, " expected");
  for (size_t i = 0; i < store.count(); ++i) {
    const nn::ParamInfo& info = store.info(static_cast<int>(i));
    mb_param p{};
    p.name = info.name.c_str();
    p.role = static_cast<mb_role>(static_cast<int>(info.role));
    p.layer = info.layer;
    p.ndim = static_cast<int32_t>(info.shape.size());
    for (size_t d = 0; d < info.shape.size(); ++d) {
      p.shape[d] = info.shape[d];
      p.full_shape[d] = info.full_shape[d];
    }
    p.sharded = info.sharding.sharded ? 1 : 0;
    p.partition_dim = info.sharding.partition_dim;
    p.numel = static_cast<int64_t>(info.numel);
    p.data = store.master(static_cast<int>(i)).data<float>();
    p.grad = store.grad(static_cast<int>(i)).data<float>();
    params_.push_back(p);
  }
  host_ = mb_host{this, &alloc_state, &tp_sum, &normal, &metric, &PluginOptimizer::log};
  char err[1024] = {0};
  creating_ = true;
  self_ = plugin_.entry->create(&host_, params_.data(), params_.size(), hparams.data(), err, sizeof err);
  creating_ = false;
  if (!self_)
    fail("optimizer plugin '", plugin_.name(), "' (", plugin_.path.string(), ") failed to start: ",
         host_error_.empty() ? std::string(err) : host_error_);
}

PluginOptimizer::~PluginOptimizer() {
  if (self_) plugin_.entry->destroy(self_);
}

void PluginOptimizer::step(int64_t step, double lr, int64_t global_batch, double norm, bool diagnostics) {
  if (norm < 0) norm = grad_norm(*store_, *tp_);
  mb_step_info info{step, lr, global_batch, seed_, norm, diagnostics ? 1 : 0};
  if (diagnostics) diagnostics_.clear();
  collecting_ = diagnostics;
  char err[1024] = {0};
  const int rc = plugin_.entry->step(self_, &info, err, sizeof err);
  collecting_ = false;
  if (rc != 0)
    fail("optimizer plugin '", plugin_.name(), "' failed at step ", step, ": ", err[0] ? err : "no message");
  store_->copy_masters_to_params();  // mixed precision: the half weights follow the fp32 masters
}

void PluginOptimizer::step(int64_t step_count, double lr, int64_t global_batch, const Tensor& grad_norm,
                           bool diagnostics, const Tensor& skip) {
  check(grad_norm.device().is_cpu() && !skip.defined(), "optimizer plugin '", plugin_.name(),
        "': a GPU run needs plugin ABI version 3 (device pointers); this build's plugins speak version ",
        MB_PLUGIN_ABI_VERSION);
  step(step_count, lr, global_batch, grad_norm.data<double>()[0], diagnostics);
}

float* PluginOptimizer::alloc_state(void* ctx, size_t index, const char* name) {
  auto* self = static_cast<PluginOptimizer*>(ctx);
  if (!self->creating_) {
    self->host_error_ = "alloc_state called outside create()";
    return nullptr;
  }
  if (index >= self->params_.size() || !name || !*name) {
    self->host_error_ = "alloc_state: bad parameter index or empty state name";
    return nullptr;
  }
  auto key = std::make_pair(std::string(self->params_[index].name), std::string(name));
  if (self->state_.count(key)) {
    self->host_error_ = "alloc_state: state '" + key.second + "' of " + key.first + " allocated twice";
    return nullptr;
  }
  Tensor& t = self->state_[key];
  t.resize(self->store_->info(static_cast<int>(index)).shape);
  return t.data();
}

void PluginOptimizer::tp_sum(void* ctx, double* values, size_t n) {
  static_cast<PluginOptimizer*>(ctx)->tp_->all_reduce(values, n, comm::ReduceOp::kSum);
}

void PluginOptimizer::normal(void* ctx, size_t index, int64_t step, float* out, size_t n) {
  auto* self = static_cast<PluginOptimizer*>(ctx);
  const nn::ParamInfo& info = self->store_->info(static_cast<int>(index));
  const size_t count = std::min(n, info.numel);
  // Keyed by (seed, step, parameter name): the same draws under any layout.
  const uint64_t key = mix_key(mix_key(self->seed_, static_cast<uint64_t>(step)),
                               name_key(info.name.data(), info.name.size()));
#pragma omp parallel for schedule(static) if (count > 65536)
  for (int64_t i = 0; i < static_cast<int64_t>(count); ++i)
    out[i] = static_cast<float>(philox_normal(key, static_cast<uint64_t>(info.full_index(i))));
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
