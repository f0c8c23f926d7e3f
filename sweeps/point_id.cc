#include "sweeps/point_id.h"

#include <cctype>
#include <cstdio>
#include <map>

namespace megabatch::sweeps {
using nlohmann::json;

namespace {

// Formats a value for a point id: integers as is, floats with 3 significant digits, a
// string with slashes (a path) by its last component, a run's checkpoints/ directory by the
// run's (runs/first/lamb-bs8-s1/checkpoints: lamb-bs8-s1), a list by its items joined with
// '+' (a blend, ["0.3", "data/wiki", "0.7", "data/books"]: 0.3+wiki+0.7+books).
std::string id_value(const json& v) {
  if (v.is_string()) {
    std::string t = v.get<std::string>();
    auto last = [&t] {
      while (!t.empty() && t.back() == '/') t.pop_back();
      const size_t slash = t.rfind('/');
      return slash == std::string::npos ? t : t.substr(slash + 1);
    };
    std::string name = last();
    if (name == "checkpoints" && t.size() > name.size()) {
      t.resize(t.size() - name.size());
      if (const std::string run = last(); !run.empty()) name = run;
    }
    return name;
  }
  if (v.is_array() && !v.empty()) {  // a data path given as a list, a blend's weights and prefixes
    std::string joined;
    for (const json& e : v) {
      if (!joined.empty()) joined += '+';
      joined += id_value(e);
    }
    return joined;
  }
  if (v.is_boolean()) return v.get<bool>() ? "on" : "off";
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  if (v.is_number()) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g", v.get<double>());
    return buf;
  }
  return v.dump();
}

// The prefix of a swept key in point ids: bs for global_batch_size, lr, mbs, the value
// alone for optimizer and model, else the initials of the key's words.
std::string id_prefix(const std::string& key) {
  static const std::map<std::string, std::string> fixed = {{"global_batch_size", "bs"},
                                                           {"micro_batch_size", "mbs"},
                                                           {"lr", "lr"},
                                                           {"optimizer", ""},
                                                           {"model", ""},
                                                           {"seed", "s"},
                                                           {"tensor_model_parallel_size", "tp"},
                                                           {"pretrained_checkpoint", "from-"}};
  if (auto it = fixed.find(key); it != fixed.end()) return it->second;
  std::string p;
  bool start = true;
  for (char c : key) {
    if (c == '_') {
      start = true;
    } else if (start) {
      p += c;
      start = false;
    }
  }
  return p;
}

}  // namespace

std::string safe_point_id(const std::string& raw) {
  constexpr size_t kMax = 120;
  std::string id;
  for (unsigned char c : raw)
    id += std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '+' ? static_cast<char>(c) : '_';
  for (size_t at; (at = id.find("..")) != std::string::npos;) id.replace(at, 2, "_.");
  if (!id.empty() && id.front() == '.') id.front() = '_';
  if (id.empty()) id = "point";
  if (id.size() > kMax) {  // cut, with a hash of the whole so that distinct ids stay distinct
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : raw) h = (h ^ c) * 1099511628211ull;
    char tail[18];
    std::snprintf(tail, sizeof tail, "-%016llx", static_cast<unsigned long long>(h));
    id = id.substr(0, kMax - 17) + tail;
  }
  return id;
}

std::string point_id(const json& config, const std::vector<std::string>& keys, bool with_seed) {
  std::string id;
  for (const auto& k : keys) {
    if (!config.contains(k)) continue;
    if (!id.empty()) id += '-';
    id += id_prefix(k);
    id += id_value(config[k]);
  }
  if (with_seed) {
    id += id.empty() ? "s" : "-s";
    id += std::to_string(config["seed"].get<int64_t>());
  }
  return safe_point_id(id);
}

}  // namespace megabatch::sweeps
