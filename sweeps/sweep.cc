#include "sweeps/sweep.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "core/config/config.h"
#include "core/train/options.h"
#include "core/util/error.h"
#include "core/util/files.h"
#include "core/util/json.h"
#include "core/util/strings.h"
#include "sweeps/point_id.h"
#include "sweeps/sweep_state.h"

namespace megabatch::sweeps {
namespace fs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;

namespace {

const std::set<std::string> kTopLevel = {"name", "description", "cluster", "include", "base", "grid", "zip",
                                         "seeds", "derive", "jobs", "threads", "checkpoints", "random"};

ordered_json read_json(const fs::path& file) {
  return parse_json_or_fail<ordered_json>(read_file(file, "sweep file"), file.string());  // a regular file only
}

// Objects merge key by key (over wins); everything else is replaced.
void merge(ordered_json& under, const ordered_json& over) {
  for (auto it = over.begin(); it != over.end(); ++it) {
    if (under.contains(it.key()) && under[it.key()].is_object() && it.value().is_object())
      merge(under[it.key()], it.value());
    else
      under[it.key()] = it.value();
  }
}

ordered_json load_with_includes(const fs::path& file, std::vector<fs::path>& chain) {
  const fs::path canon = fs::weakly_canonical(file);
  for (const auto& f : chain)
    check(f != canon, file.string(), ": includes itself (", join([&] {
            std::vector<std::string> v;
            for (const auto& c : chain) v.push_back(c.string());
            return v;
          }(), " -> "), ")");
  chain.push_back(canon);
  ordered_json j = read_json(file);
  check(j.is_object(), file.string(), ": a sweep file is a JSON object");
  std::vector<std::string> known(kTopLevel.begin(), kTopLevel.end());
  for (auto it = j.begin(); it != j.end(); ++it)
    check(kTopLevel.count(it.key()), file.string(), ": unknown key '", it.key(), "'", did_you_mean(it.key(), known),
          "; a sweep file has ", join(known, ", "));
  if (j.contains("include")) {
    check(j["include"].is_string(), file.string(), ": include: expected a file name");
    const fs::path inc = file.parent_path() / j["include"].get<std::string>();
    ordered_json base = load_with_includes(inc, chain);
    base.erase("include");
    j.erase("include");
    merge(base, j);
    j = base;
  }
  chain.pop_back();
  return j;
}

// A null value unsets its key (JSON merge patch, RFC 7396): `"weight_decay": null` in the base
// of a file that includes another, or in one entry of an axis, leaves that option at train's
// default for the points it reaches, as if it had never been given; so do nulls inside objects
// (optimizer_params, derive) and at the top level. Lists are values, and keep theirs.
template <class Json>
void drop_nulls(Json& j) {
  if (!j.is_object()) return;
  for (auto it = j.begin(); it != j.end();) {
    if (it->is_null()) {
      it = j.erase(it);
    } else {
      drop_nulls(*it);
      ++it;
    }
  }
}

// One value of an axis, as train options hold it (unordered), with the nulls inside an object
// value dropped; a null value itself stays, and unsets its key for the points it reaches.
json axis_value(const ordered_json& v) {
  json out = json::parse(v.dump());
  drop_nulls(out);
  return out;
}

struct Axis {  // one grid key, one zip group or the random draws: a list of assignments
  std::vector<std::string> keys;
  bool every_key_in_id = false;  // random draws: each key names the point (they vary independently)
  std::vector<std::vector<json>> values;  // values[i] assigns keys[k] = values[i][k]
};

// The `random` axis: {"count": N, "seed": S, "params": {key: {"uniform": [lo, hi]} or
// {"log_uniform": [lo, hi]}}}: N assignments drawn from a 64-bit Mersenne Twister seeded
// with S (std::mt19937_64 is specified exactly, and the unit interval is taken from its top
// 53 bits here, so the points are the same on every machine), rounded to 4 significant
// digits so that ids stay readable. Integer bounds draw integers (log-uniform rounded).
Axis random_axis(const ordered_json& r, const std::string& w) {
  check(r.is_object() && r.contains("count") && r.contains("params"), w,
        ": expected {\"count\": N, \"seed\": S, \"params\": {\"lr\": {\"log_uniform\": [1e-4, 1e-2]}}}");
  for (auto it = r.begin(); it != r.end(); ++it)
    check(it.key() == "count" || it.key() == "seed" || it.key() == "params", w, ".", it.key(),
          ": unknown; random has count, seed and params");
  check(r["count"].is_number_integer() && r["count"].get<int64_t>() >= 1 && r["count"].get<int64_t>() <= 100000, w,
        ".count: expected an integer in [1, 100000], got ", r["count"].dump());
  check(!r.contains("seed") || (r["seed"].is_number_integer() && r["seed"].get<int64_t>() >= 0), w,
        ".seed: expected an integer >= 0, got ", r.contains("seed") ? r["seed"].dump() : "");
  const uint64_t seed = r.contains("seed") ? r["seed"].get<uint64_t>() : 0;
  check(r["params"].is_object() && !r["params"].empty(), w, ".params: expected {option: {\"uniform\"|\"log_uniform\": [lo, hi]}}");
  Axis a;
  a.every_key_in_id = true;
  struct Dist {
    bool log, integer;
    double lo, hi;
  };
  std::vector<Dist> dists;
  for (auto it = r["params"].begin(); it != r["params"].end(); ++it) {
    const std::string wk = w + ".params." + it.key();
    check(it.key() != "seed", wk, ": seeds are an axis of their own (\"seeds\": [...])");
    const auto& d = it.value();
    check(d.is_object() && d.size() == 1 && (d.contains("uniform") || d.contains("log_uniform")), wk,
          ": expected {\"uniform\": [lo, hi]} or {\"log_uniform\": [lo, hi]}");
    const bool log = d.contains("log_uniform");
    const auto& b = log ? d["log_uniform"] : d["uniform"];
    check(b.is_array() && b.size() == 2 && b[0].is_number() && b[1].is_number(), wk, ": expected [lo, hi] (numbers)");
    const double lo = b[0].get<double>(), hi = b[1].get<double>();
    check(std::isfinite(lo) && std::isfinite(hi) && lo <= hi, wk, ": expected finite lo <= hi, got ", b.dump());
    check(!log || lo > 0, wk, ": log_uniform needs lo > 0, got ", lo);
    a.keys.push_back(it.key());
    dists.push_back({log, b[0].is_number_integer() && b[1].is_number_integer(), lo, hi});
  }
  std::mt19937_64 gen(seed);
  auto unit = [&] { return static_cast<double>(gen() >> 11) * 0x1.0p-53; };
  for (int64_t i = 0; i < r["count"].get<int64_t>(); ++i) {
    std::vector<json> row;
    for (const auto& d : dists) {
      const double u = unit();
      double x = d.log ? std::exp(std::log(d.lo) + u * (std::log(d.hi) - std::log(d.lo))) : d.lo + u * (d.hi - d.lo);
      if (d.integer) {
        row.push_back(static_cast<int64_t>(std::llround(x)));
      } else {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.4g", x);
        x = std::strtod(buf, nullptr);
        row.push_back(std::min(d.hi, std::max(d.lo, x)));
      }
    }
    a.values.push_back(row);
  }
  return a;
}

// grid: {option: [values...]}: one axis per option.
void grid_axes(const ordered_json& j, const std::string& where, std::vector<Axis>& axes) {
  if (!j.contains("grid")) return;
  check(j["grid"].is_object(), where, ": grid: expected an object {option: [values...]}");
  for (auto it = j["grid"].begin(); it != j["grid"].end(); ++it) {
    check(it.value().is_array() && !it.value().empty(), where, ": grid.", it.key(), ": expected a non-empty list");
    Axis a;
    a.keys = {it.key()};
    for (const auto& v : it.value()) a.values.push_back({axis_value(v)});
    axes.push_back(a);
  }
}

// zip: a group (or a list of groups) of options whose lists vary together: one axis each.
void zip_axes(const ordered_json& j, const std::string& where, std::vector<Axis>& axes) {
  if (!j.contains("zip")) return;
  ordered_json groups = j["zip"].is_array() ? j["zip"] : ordered_json::array({j["zip"]});
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string w = where + ": zip[" + std::to_string(g) + "]";
    check(groups[g].is_object() && !groups[g].empty(), w, ": expected an object {option: [values...]}");
    Axis a;
    size_t n = 0;
    for (auto it = groups[g].begin(); it != groups[g].end(); ++it) {
      check(it.value().is_array() && !it.value().empty(), w, ".", it.key(), ": expected a non-empty list");
      if (a.keys.empty()) n = it.value().size();
      check(it.value().size() == n, w, ".", it.key(), ": ", it.value().size(), " values, but ",
            a.keys.empty() ? it.key() : a.keys.front(), " has ", n, "; lists that vary together need the same length");
      a.keys.push_back(it.key());
    }
    for (size_t i = 0; i < n; ++i) {
      std::vector<json> row;
      for (const auto& k : a.keys) row.push_back(axis_value(groups[g][k][i]));
      a.values.push_back(row);
    }
    axes.push_back(a);
  }
}

// seeds: [integers >= 0] (empty: not given).
std::vector<int64_t> read_seeds(const ordered_json& j, const std::string& where) {
  std::vector<int64_t> seeds;
  if (!j.contains("seeds")) return seeds;
  check(j["seeds"].is_array() && !j["seeds"].empty(), where, ": seeds: expected a non-empty list of integers");
  for (const auto& v : j["seeds"]) {
    check(v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX}) && v.get<int64_t>() >= 0,
          where, ": seeds: ", v.dump(), " is not an integer >= 0");
    seeds.push_back(v.get<int64_t>());
  }
  return seeds;
}

// derive: values computed per point from its batch size.
struct Derive {
  std::string rule = "none";  // lr_scaling: sqrt, linear or none
  int64_t ref_batch = 0;      // the batch at which lr is given
  int64_t budget = 0;         // sample_budget: samples every point trains on (0: none)
};

// Why a point of a sample budget counts samples ("a ramped batch counts samples",
// "lr_warmup_samples counts samples"), or "" where it counts iterations.
std::string samples_counted(const json& c) {
  if (c.contains("rampup_batch_size")) return "a ramped batch counts samples";
  const std::string key = train::schedule_key_counting(c, "samples");
  return key.empty() ? "" : key + " counts samples";
}

Derive read_derive(const ordered_json& j, const std::string& where) {
  Derive out;
  if (!j.contains("derive")) return out;
  const auto& d = j["derive"];
  check(d.is_object(), where, ": derive: expected an object");
  for (auto it = d.begin(); it != d.end(); ++it)
    check(it.key() == "lr_scaling" || it.key() == "sample_budget", where, ": derive.", it.key(),
          ": unknown; derive has lr_scaling and sample_budget");
  if (d.contains("lr_scaling")) {
    const auto& ls = d["lr_scaling"];
    check(ls.is_object() && ls.contains("rule") && ls["rule"].is_string(), where,
          ": derive.lr_scaling: expected {\"rule\": \"sqrt\"|\"linear\", \"ref_batch\": N}");
    out.rule = ls["rule"].get<std::string>();
    check(out.rule == "sqrt" || out.rule == "linear" || out.rule == "none", where, ": derive.lr_scaling.rule: '", out.rule,
          "' is not sqrt, linear or none");
    check(ls.contains("ref_batch") && ls["ref_batch"].is_number_integer() && ls["ref_batch"].get<int64_t>() > 0,
          where, ": derive.lr_scaling.ref_batch: expected a positive integer (the batch at which lr is given)");
    out.ref_batch = ls["ref_batch"].get<int64_t>();
  }
  if (d.contains("sample_budget")) {
    check(d["sample_budget"].is_number_integer() && d["sample_budget"].get<int64_t>() > 0, where,
          ": derive.sample_budget: expected a positive integer (samples every point trains on)");
    out.budget = d["sample_budget"].get<int64_t>();
  }
  return out;
}

// name, jobs, threads and checkpoints of the sweep file.
void read_settings(const ordered_json& j, const std::string& where, Sweep& s) {
  check(j.contains("name") && j["name"].is_string() && !j["name"].get<std::string>().empty(), where,
        ": 'name' (a string) is required: it names runs/<name>/");
  s.name = j["name"].get<std::string>();
  for (char c : s.name)
    check(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.', where, ": name '", s.name,
          "' may only contain letters, digits, '_', '-' and '.'");
  for (const char* key : {"jobs", "threads"}) {
    if (!j.contains(key)) continue;
    check(j[key].is_number_integer() && j[key].get<int64_t>() >= 1 && j[key].get<int64_t>() <= 4096, where, ": ", key,
          ": expected an integer in [1, 4096], got ", j[key].dump());
    (std::string(key) == "jobs" ? s.jobs : s.threads) = static_cast<int>(j[key].get<int64_t>());
  }
  if (j.contains("checkpoints")) {
    check(j["checkpoints"].is_string() &&
              (j["checkpoints"] == "final" || j["checkpoints"] == "all" || j["checkpoints"] == "none"),
          where, ": checkpoints: expected \"final\" (keep a finished point's last checkpoint), \"all\" or \"none\", got ",
          j["checkpoints"].dump());
    s.checkpoints = j["checkpoints"].get<std::string>();
  }
}

// The swept keys, in file order, and the keys of point ids: each grid key and the first key
// of each zip group (the others vary with it), optimizer, model and global batch first, lr
// last when it varies.
struct IdKeys {
  std::vector<std::string> swept, id;
};

IdKeys id_keys(const std::vector<Axis>& axes, bool lr_derived) {
  IdKeys out;
  std::vector<std::string> leading;
  for (const auto& a : axes) {
    for (const auto& k : a.keys)
      if (std::find(out.swept.begin(), out.swept.end(), k) == out.swept.end()) out.swept.push_back(k);
    for (size_t k = 0; k < (a.every_key_in_id ? a.keys.size() : 1); ++k)
      if (std::find(leading.begin(), leading.end(), a.keys[k]) == leading.end()) leading.push_back(a.keys[k]);
  }
  const bool lr_varies = lr_derived || std::find(out.swept.begin(), out.swept.end(), "lr") != out.swept.end();
  for (const char* first : {"optimizer", "model", "global_batch_size"})
    if (std::find(leading.begin(), leading.end(), first) != leading.end()) out.id.push_back(first);
  for (const auto& k : leading)
    if (k != "lr" && std::find(out.id.begin(), out.id.end(), k) == out.id.end()) out.id.push_back(k);
  if (lr_varies) out.id.push_back("lr");
  return out;
}

// The product of the axes over `base`, counted before it is made (refused past max_points).
std::vector<json> expand(const json& base, const std::vector<Axis>& axes, size_t seeds, size_t max_points,
                         const std::string& where) {
  uint64_t count = seeds;
  bool overflow = false;
  for (const auto& a : axes) overflow = overflow || __builtin_mul_overflow(count, uint64_t{a.values.size()}, &count);
  check(!overflow && count <= max_points, where, ": the sweep has ", overflow ? std::string("over 2^64") : std::to_string(count),
        " points (grid x zip groups x seeds), more than the limit of ", max_points,
        "; raise it with --max-points N if you mean it");
  std::vector<json> configs = {base};
  for (const auto& a : axes) {
    std::vector<json> next;
    for (const auto& c : configs)
      for (const auto& row : a.values) {
        json p = c;
        for (size_t k = 0; k < a.keys.size(); ++k) {
          if (row[k].is_null())
            p.erase(a.keys[k]);  // unset for these points
          else
            p[a.keys[k]] = row[k];
        }
        next.push_back(p);
      }
    configs = next;
  }
  return configs;
}

// The derived values of a point (config c, its id as name(c) gives it): lr scaled by its
// batch, train_iters from the sample budget. The batch they divide by is the point's global
// batch: global_batch_size, else micro_batch_size (train's default where none) x
// data_parallel_size (1 where none), which is then written into the point, so that it trains
// at the batch its values were derived for: train's own default, micro x DP, takes DP from the
// job, which a cluster job of more ranks would have made larger than the sweep assumed.
void derive_values(json& c, const Derive& d, const std::string& where,
                   const std::function<std::string(const json&)>& name) {
  if (d.rule == "none" && d.budget <= 0) return;
  auto positive = [&](const char* key) {
    check(c[key].is_number_integer() && c[key].get<int64_t>() >= 1, where, ": point ", name(c), ": ", key,
          ": expected an integer >= 1, got ", c[key].dump());
    return c[key].get<int64_t>();
  };
  if (c.contains("global_batch_size"))
    positive("global_batch_size");
  else
    for (const char* k : {"micro_batch_size", "data_parallel_size"})
      if (c.contains(k)) positive(k);
  const int64_t B = global_batch_of(c);  // as train takes it: its default is micro batch x DP
  c["global_batch_size"] = B;
  if (d.rule != "none") {
    check(c.contains("lr") && c["lr"].is_number(), where, ": derive.lr_scaling needs a base learning rate 'lr' (in base or an axis)");
    const double r = static_cast<double>(B) / static_cast<double>(d.ref_batch);
    // every learning rate train's own --lr-scaling scales
    for (const char* key : {"lr", "min_lr", "lr_warmup_init", "decoupled_lr", "decoupled_min_lr"})
      if (c.contains(key) && c[key].is_number()) c[key] = c[key].get<double>() * (d.rule == "sqrt" ? std::sqrt(r) : r);
    const bool train_scales = c.contains("lr_scaling") && c["lr_scaling"] != "none";
    check(!train_scales, where, ": point ", name(c), ": lr_scaling ", train_scales ? c["lr_scaling"].dump() : "",
          " and derive.lr_scaling both scale lr with the batch, so it would be scaled twice; keep one "
          "(derive.lr_scaling writes each point's scaled lr into its config and id, train's lr_scaling scales it when "
          "the run starts)");
  }
  if (d.budget > 0) {
    check(d.budget % B == 0, where, ": point ", name(c), ": the sample budget ", d.budget,
          " is not a multiple of global_batch_size ", B, "; pick a budget every batch size divides");
    // A point counts samples where its batch or schedule does, as train requires: a ramped
    // batch (--rampup-batch-size, as Megatron requires), or a warmup, decay or WSD decay of so
    // many samples (the same at every batch size). The budget is then its train_samples.
    const std::string in_samples = samples_counted(c);
    const std::string length = !in_samples.empty()
                                   ? "train_samples " + std::to_string(d.budget) + " (" + in_samples + ")"
                                   : std::to_string(d.budget) + " samples / global batch " + std::to_string(B) + " = " +
                                         std::to_string(d.budget / B) + " iterations";
    // the run's length is the budget's: a length given beside it would be replaced unseen
    for (const char* key : {"train_iters", "train_samples"})
      check(!c.contains(key), where, ": point ", name(c), ": ", key, " ", c.contains(key) ? c[key].dump() : "",
            " would be replaced by derive.sample_budget (", length, "); drop ", key,
            " (a null unsets it over an included file), or drop the sample budget");
    if (!in_samples.empty())
      c["train_samples"] = d.budget;
    else
      c["train_iters"] = d.budget / B;
  }
}

}  // namespace

namespace {
// Every "{runs_dir}" in the string values of `j` (lists and objects too) made `runs_dir`.
void put_runs_dir(json& j, const std::string& runs_dir) {
  static const std::string kToken = "{runs_dir}";
  if (j.is_string()) {
    std::string t = j.get<std::string>();
    for (size_t at = 0; (at = t.find(kToken, at)) != std::string::npos; at += runs_dir.size())
      t.replace(at, kToken.size(), runs_dir);
    j = t;
  } else if (j.is_structured()) {
    for (auto& e : j) put_runs_dir(e, runs_dir);
  }
}
}  // namespace

Sweep load_sweep(const fs::path& file, size_t max_points, const std::string& runs_dir) {
  std::vector<fs::path> chain;
  Sweep s;
  s.file = file;
  s.spec = load_with_includes(file, chain);
  drop_nulls(s.spec);
  const ordered_json& j = s.spec;
  const std::string where = file.string();
  read_settings(j, where, s);
  json base = j.contains("base") ? json::parse(j["base"].dump()) : json::object();
  check(base.is_object(), where, ": base: expected an object of train options");
  std::vector<Axis> axes;
  grid_axes(j, where, axes);
  zip_axes(j, where, axes);
  if (j.contains("random")) axes.push_back(random_axis(j["random"], where + ": random"));
  std::vector<int64_t> seeds = read_seeds(j, where);
  const Derive derive = read_derive(j, where);
  const IdKeys keys = id_keys(axes, derive.rule != "none");
  const bool seed_varies = !seeds.empty();
  if (seeds.empty()) {
    check(!base.contains("seed") || (base["seed"].is_number_integer() && base["seed"].get<int64_t>() >= 0), where,
          ": base.seed: expected an integer >= 0, got ", base.contains("seed") ? base["seed"].dump() : "");
    seeds.push_back(base.contains("seed") ? base["seed"].get<int64_t>() : 1234);
  }
  auto name = [&](const json& c) { return point_id(c, keys.id, seed_varies); };  // the id of the point of config c
  const auto& schema = train::train_schema();
  std::map<std::string, size_t> seen;
  for (const auto& c0 : expand(base, axes, seeds.size(), max_points, where))
    for (int64_t seed : seeds) {
      Point p;
      p.config = c0;
      put_runs_dir(p.config, runs_dir);
      p.config["seed"] = seed;
      derive_values(p.config, derive, where, name);
      p.id = name(p.config);  // with the derived lr
      // each point a TensorBoard run of its own, DIR/<id>: points writing DIR itself would show
      // as one run, their curves interleaved
      if (p.config.contains("tensorboard_dir") && p.config["tensorboard_dir"].is_string())
        p.config["tensorboard_dir"] = (fs::path(p.config["tensorboard_dir"].get<std::string>()) / p.id).string();
      p.swept = keys.swept;
      try {  // validated against train's options (keys and types)
        (void)config::resolve_json(schema, p.config, where + ": point " + p.id);
      } catch (const Error& e) {
        fail(e.what());
      }
      for (const char* key : {"finetune", "no_load_optim"})
        check(
            !p.config.contains(key) || p.config[key] == false, where, ": point ", p.id, ": ", key,
            " would apply to the point's own checkpoints when it resumes (restarting it at iteration 0, or without its "
            "optimizer state), not to another run's; to start each point from another run's weights, give "
            "pretrained_checkpoint (a checkpoint directory, such as runs/NAME/ID/checkpoints of an earlier sweep) "
            "instead");
      check(!p.config.contains("ckpt_step"), where, ": point ", p.id, ": ckpt_step ",
            p.config.value("ckpt_step", json()).dump(),
            " would rewind the point to that iteration each time it resumes (setting its later checkpoints aside), "
            "so it would never finish; drop it (train --load runs/NAME/ID/checkpoints --ckpt-step N --save DIR "
            "branches one point's run)");
      for (const char* key : {"run_dir", "save", "load"})
        check(!p.config.contains(key), where, ": point ", p.id, ": ", key,
              " is the sweep's to set (each point runs in runs/NAME/ID/ and saves to and resumes from its "
              "checkpoints/ there), so this value would be ignored; drop it");
      // switches that make train exit 0 having trained nothing: the point would be marked done
      for (const char* key : {"check", "skip_train", "print_params", "print_config", "list_models", "list_optimizers"})
        check(!p.config.contains(key) || p.config[key] == false, where, ": point ", p.id, ": ", key,
              " makes train end without training, and the sweep would take the point for finished; drop it (sweep "
              "run --dry-run checks every point; train --skip-train --load runs/NAME/ID/checkpoints --run-dir DIR "
              "evaluates one)");
      // exit_interval stops a run before its end with the status of a finished one
      check(!p.config.contains("exit_interval") || p.config["exit_interval"] == 0, where, ": point ", p.id,
            ": exit_interval ", p.config.value("exit_interval", json()).dump(),
            " would stop the point before its end, and the sweep would take it for finished; drop it (Ctrl-C "
            "stops a sweep's points at a checkpoint, and sweep run goes on from there)");
      const std::string counted = samples_counted(p.config);  // where the budget sets the length
      const std::string conflict = train::schedule_conflict(
          p.config, [](const std::string& key) { return key; },
          derive.budget == 0 ? "" : "derive.sample_budget" + (counted.empty() ? "" : ", as " + counted));
      check(conflict.empty(), where, ": point ", p.id, ": ", conflict);
      check(p.config.contains("lr"), where, ": point ", p.id, ": no 'lr' (give it in base or an axis)");
      check(p.config.contains("train_iters") || p.config.contains("train_samples"), where, ": point ", p.id,
            ": no train_iters, train_samples or derive.sample_budget");
      auto [it, fresh] = seen.emplace(p.id, s.points.size());
      check(fresh, where, ": points ", it->second, " and ", s.points.size(), " both get the id '", p.id,
            "'; vary a key that appears in ids or use distinct seeds");
      s.points.push_back(p);
    }
  return s;
}

std::string noise_scale_note(const Sweep& sweep) {
  std::set<int64_t> batches;
  for (const Point& p : sweep.points) {
    const json& c = p.config;
    if (!c.value("log_noise_scale", false) || c.contains("noise_scale_window") || c.contains("noise_scale_ema")) continue;
    if (c.contains("global_batch_size") && c["global_batch_size"].is_number_integer())
      batches.insert(c["global_batch_size"].get<int64_t>());
  }
  if (batches.size() < 2) return "";
  const json& decay = train::train_schema().find("noise_scale_ema")->default_value;  // train's default
  const int64_t steps = std::llround(1.0 / (1.0 - decay.get<double>()));  // the average's memory
  const std::string lo = std::to_string(*batches.begin()), hi = std::to_string(*batches.rbegin());
  return "note: points at global batch " + lo + " to " + hi + " log the noise scale averaged by " + decay.dump() +
         " a step (" + std::to_string(steps) + " steps: " + std::to_string(steps * *batches.begin()) +
         " samples at batch " + lo + ", " + std::to_string(steps * *batches.rbegin()) + " at " + hi +
         "), so their B_simple at the same loss is not averaged alike; \"noise_scale_window\": " + hi +
         " in base (the largest batch) averages every point over the same samples";
}

}  // namespace megabatch::sweeps
