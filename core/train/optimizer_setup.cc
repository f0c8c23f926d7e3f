#include "core/train/optimizer_setup.h"

#include <ostream>

#include "core/train/grad_buckets.h"
#include "core/util/error.h"

namespace megabatch::train {

void list_optimizers(const std::vector<std::filesystem::path>& search, std::ostream& out) {
  int broken = 0;
  for (const auto& [name, path] : optim::available_plugins(search)) {
    try {
      out << optim::describe_hparams(optim::load_plugin(name, search)) << "  file: " << path.string()
                << "\n";
    } catch (const std::exception& e) {
      ++broken;
      out << name << "  BROKEN: " << e.what() << "\n  file: " << path.string() << "\n";
    }
  }
  if (broken) out << broken << " plugin file(s) could not be loaded (see BROKEN above)\n";
}

nlohmann::json optimizer_params(const config::Resolved& r, const optim::Plugin& plugin) {
  const nlohmann::json& v = r.values;
  nlohmann::json hp = nlohmann::json::object();
  const std::pair<const char*, const char*> aliases[] = {{"weight_decay", "weight_decay"}, {"adam_beta1", "beta1"},
                                                         {"adam_beta2", "beta2"}, {"adam_eps", "eps"},
                                                         {"sgd_momentum", "momentum"}};
  for (const auto& [flag, name] : aliases) {
    if (!r.given(flag)) continue;
    check(optim::hparam_index(plugin, name) >= 0, flag, " was given but optimizer plugin '", plugin.name(),
              "' has no hyperparameter '", name, "'; drop it or pick an optimizer that has one");
    // both: optimizer_params would win without a word (a sweep's axis over the flag did nothing)
    if (v["optimizer_params"].contains(name))
      fail("the plugin's ", name, " is given twice: ", flag, " (--", config::flag_name(flag), ") ", v[flag].dump(),
           " and optimizer_params.", name, " (--optimizer-params ", name, "=...) ", v["optimizer_params"][name].dump(),
           "; give it in one place");
    hp[name] = v[flag];
  }
  if (v["weight_decay_incr_style"].get<std::string>() != "constant") {  // a schedule (train_options checked its flags)
    optim::check_takes_wd_schedule(plugin);
    check(!v["optimizer_params"].contains("weight_decay"), "--weight-decay-incr-style ",
          v["weight_decay_incr_style"].get<std::string>(), " sets the weight decay from --start-weight-decay to ",
          "--end-weight-decay, so optimizer_params.weight_decay ",
          // (the message's arguments are evaluated whether or not it is said: a key read
          // from a const object must be there)
          v["optimizer_params"].value("weight_decay", nlohmann::json()).dump(), " would be ignored; drop it");
  }
  if (v.contains("decoupled_lr")) optim::check_takes_decoupled_lr(plugin);
  for (const auto& [k, x] : v["optimizer_params"].items()) hp[k] = x;
  return hp;
}

std::unique_ptr<optim::DpShards> make_dp_shards(nn::ParameterStore& params, comm::Communicator& dp, int64_t bucket_size,
                                                bool overlap_grad_reduce, std::ostream& console) {
  if (dp.size() <= 1) return nullptr;
  const size_t elems = bucket_elems(bucket_size, params.flat_size(), dp.size(), overlap_grad_reduce);
  auto shards = std::make_unique<optim::DpShards>(params, bucket_ranges(params, elems), dp);
  console << "> distributed optimizer: this rank steps and keeps optimizer state"
          << (params.mixed() ? " and fp32 master weights" : "") << " for " << shards->piece_elements() << " of "
          << params.num_parameters() << " local parameters (DP " << dp.size() << ", " << shards->buckets()
          << " bucket(s))" << std::endl;
  return shards;
}

}  // namespace megabatch::train
