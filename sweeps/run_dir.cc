#include "sweeps/run_dir.h"

#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>

#include "core/io/checkpoint.h"
#include "core/util/error.h"
#include "core/util/files.h"
#include "core/util/json.h"

namespace megabatch::sweeps {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The mark of a point directory made by the sweep tool: nothing without it is deleted.
constexpr const char* kPointMark = ".megabatch-point";

bool has_mark(const fs::path& dir) { return fs::symlink_status(dir / kPointMark).type() == fs::file_type::regular; }

// Keys that cannot change a point's results: where plugins are searched, threads, where
// and how often checkpoints are written, extra outputs.
const std::set<std::string> kResultNeutral = {
    "plugin_path",   "threads",          "tensorboard_dir",      "skip_memory_check",
    "save_interval", "keep_checkpoints", "save_retain_interval", "overlap_grad_reduce"};

// The --save-retain-interval of the run whose config.json this is (0: none, or no readable file).
int64_t retain_interval(const fs::path& config) {
  try {
    if (!fs::exists(config)) return 0;
    const auto c = parse_json(read_file(config, "run's configuration"));
    if (c && c->is_object() && c->contains("save_retain_interval") && (*c)["save_retain_interval"].is_number_integer())
      return (*c)["save_retain_interval"].get<int64_t>();
  } catch (const std::exception&) {
  }
  return 0;
}

// What policy `keep` leaves of dir's checkpoints; nullopt when it touches none ("all", or dir
// is not a directory the run made: a symlink, or missing). "final" keeps the newest and those
// the point's run retains for good (--save-retain-interval, in its config.json beside dir).
// Neither keeps the checkpoints a rewind or a fresh start set aside in dir/earlier/N: another
// trajectory's, past the iteration the point's finished run went on from.
std::optional<io::Kept> checkpoints_kept(const fs::path& dir, const std::string& keep) {
  if (keep == "all" || !is_real_dir(dir)) return std::nullopt;
  if (keep != "final") return io::Kept{0, 0, true};
  return io::Kept{1, retain_interval(dir.parent_path() / "config.json"), true};
}

// A point's record file (DONE, DIVERGED, FAILED) as a JSON object; none where it is missing,
// unreadable or not an object (an older point.sbatch's DONE held a date).
std::optional<json> read_record(const fs::path& file) {
  try {
    if (!fs::exists(file)) return std::nullopt;
    auto record = parse_json(read_file(file, "point's record"));
    if (record && record->is_object()) return record;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

}  // namespace

// ---- the sweep's state --------------------------------------------------------------------

json read_sweep_state(const fs::path& sweep_dir) {
  const fs::path file = sweep_dir / "sweep.json";
  check(fs::exists(file), file.string(), ": no sweep here (sweep run writes runs/<name>/sweep.json)");
  const std::string advice = "; move it away to start the sweep afresh";
  std::string why;
  auto parsed = parse_json(read_file(file, "sweep state"), &why);
  if (!parsed) fail(file.string(), ": unreadable (", why, ")", advice);
  const json& s = *parsed;
  // the fields sweep run and sweep status read back, with their types (a hand edit or a
  // damaged file is named here, not met as a library error later)
  auto need = [&](bool ok, const std::string& what) {
    if (!ok) fail(file.string(), ": ", what, advice);
  };
  need(s.is_object() && s.contains("points") && s["points"].is_array(), "no \"points\" list");
  need(!s.contains("sweep_pid") || s["sweep_pid"].is_number_integer(), "\"sweep_pid\" is not an integer");
  need(!s.contains("name") || s["name"].is_string(), "\"name\" is not a string");
  need(!s.contains("file") || s["file"].is_string(), "\"file\" is not a string");
  need(!s.contains("checkpoints") ||
           (s["checkpoints"].is_string() &&
            (s["checkpoints"] == "final" || s["checkpoints"] == "all" || s["checkpoints"] == "none")),
       "\"checkpoints\" is not \"final\", \"all\" or \"none\"");
  for (size_t i = 0; i < s["points"].size(); ++i) {
    const json& p = s["points"][i];
    const std::string at = "points[" + std::to_string(i) + "]";
    need(p.is_object() && p.contains("id") && p["id"].is_string(), at + " has no \"id\" string");
    auto typed = [&](const char* key, bool (json::*is)() const noexcept, const char* type) {
      need(!p.contains(key) || (p[key].*is)(), at + "." + key + " is not " + type);
    };
    typed("config", &json::is_object, "an object");
    typed("state", &json::is_string, "a string");
    typed("reason", &json::is_string, "a string");
    typed("train_iters", &json::is_number_integer, "an integer");
    typed("wall_s", &json::is_number, "a number");
    if (p.contains("config") && p["config"].contains("global_batch_size")) {  // sweep export's samples axis
      const json& b = p["config"]["global_batch_size"];
      need(b.is_number_integer() && b.get<int64_t>() >= 1, at + ".config.global_batch_size is not an integer >= 1");
    }
  }
  return std::move(*parsed);
}

std::vector<fs::path> finished_point_dirs(const fs::path& sweep_dir, const json& state) {
  std::vector<fs::path> out;
  for (const auto& p : state.at("points")) {
    const fs::path pd = sweep_dir / p.at("id").get<std::string>();
    if (!is_real_dir(pd) || !has_mark(pd)) continue;
    if (finished(pd)) out.push_back(pd);
  }
  return out;
}

bool exported(const fs::path& dir) { return fs::exists(dir / "points.txt"); }

DiskUsage disk_usage(const fs::path& dir) {
  DiskUsage u;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->symlink_status(ec).type() != fs::file_type::regular) continue;
    const auto size = static_cast<int64_t>(it->file_size(ec));
    if (ec) continue;
    u.total += size;
    const fs::path in = it->path().parent_path();  // checkpoints/, or checkpoints/earlier/N/
    if (in.filename() == "checkpoints" ||
        (in.parent_path().filename() == io::kSetAsideDir && in.parent_path().parent_path().filename() == "checkpoints"))
      u.checkpoints += size;
  }
  return u;
}

// ---- a point's directory ------------------------------------------------------------------

void make_point_dir(const fs::path& dir) {
  fs::create_directories(dir);
  if (!fs::exists(fs::symlink_status(dir / kPointMark))) write_file_atomic(dir / kPointMark, "made by megabatch sweep\n");
}

void remove_point_dir(const fs::path& sweep_dir, const fs::path& dir) {
  const std::string name = dir.filename().string();
  check(dir.parent_path() == sweep_dir && !name.empty() && name != "." && name != "..", "not removing ", dir.string(),
        ": not a point directory of ", sweep_dir.string());
  const auto st = fs::symlink_status(dir);
  if (st.type() == fs::file_type::not_found) return;
  check(st.type() == fs::file_type::directory, "not removing ", dir.string(),
        ": it is a symlink or not a directory; the sweep tool deletes only what it made (remove it yourself)");
  check(has_mark(dir), "not removing ", dir.string(), ": it has no ", kPointMark,
        " mark, so the sweep tool did not make it (remove it yourself, or give the sweep a new name)");
  fs::remove_all(dir);
}

std::vector<std::string> config_changes(const fs::path& dir, const json& config) {
  if (!fs::exists(dir / "point.json")) return {};
  json old;
  try {
    old = json::parse(read_file(dir / "point.json", "point configuration"));
  } catch (const std::exception&) {
    return {"point.json unreadable"};
  }
  std::vector<std::string> out;
  auto text = [](const json& o, const std::string& k) { return o.contains(k) ? o[k].dump() : std::string("unset"); };
  std::set<std::string> keys;
  for (const auto& [k, v] : old.items()) keys.insert(k);
  for (const auto& [k, v] : config.items()) keys.insert(k);
  for (const auto& k : keys) {
    if (kResultNeutral.count(k)) continue;
    if (old.contains(k) && config.contains(k) && old[k] == config[k]) continue;
    out.push_back(k + ": " + text(old, k) + " -> " + text(config, k));
  }
  return out;
}

bool finished(const fs::path& dir) { return fs::exists(dir / "DONE") || fs::exists(dir / "DIVERGED"); }

double done_wall_s(const fs::path& dir) {
  const auto done = read_record(dir / "DONE");
  return done && done->contains("wall_s") && (*done)["wall_s"].is_number() ? std::max(0.0, (*done)["wall_s"].get<double>())
                                                                           : 0.0;
}

void mark_failed(const fs::path& dir, const std::string& reason) {
  write_file_atomic(dir / "FAILED", json({{"reason", reason}}).dump() + "\n");
}

std::string failed_reason(const fs::path& dir) {
  if (!fs::exists(dir / "FAILED")) return "";
  const auto failed = read_record(dir / "FAILED");
  if (failed && failed->contains("reason") && (*failed)["reason"].is_string()) return (*failed)["reason"].get<std::string>();
  return "failed under its launcher (FAILED unreadable)";
}

std::string divergence_reason(const fs::path& dir) {
  const auto d = read_record(dir / "DIVERGED");
  if (!d) return "diverged (DIVERGED unreadable)";
  try {  // a field of another type
    return "iteration " + std::to_string(d->value("iteration", int64_t{0})) + ": " + d->value("reason", std::string("?"));
  } catch (const std::exception&) {
    return "diverged (DIVERGED unreadable)";
  }
}

// ---- a point's log ------------------------------------------------------------------------

Progress parse_progress(const fs::path& log) {
  Progress p;
  const std::string t = read_file_tail(log, 16384);
  // Megatron's line: " [date time] iteration      100/     320 | ... | lm loss: 7.1E+00 | ..."
  const std::string mark = "] iteration ";
  size_t at = t.rfind(mark);
  while (at != std::string::npos) {
    const size_t eol = t.find('\n', at);
    const std::string line = t.substr(at, eol == std::string::npos ? std::string::npos : eol - at);
    const size_t slash = line.find('/');
    const size_t loss = line.find("lm loss: ");
    if (slash != std::string::npos && loss != std::string::npos && eol != std::string::npos) {
      p.iteration = std::atoll(line.substr(mark.size(), slash - mark.size()).c_str());
      const std::string consumed = "consumed samples: ";
      if (const size_t c = line.find(consumed); c != std::string::npos)
        p.consumed = std::atoll(line.c_str() + c + consumed.size());
      p.loss = std::atof(line.c_str() + loss + 9);
      p.has_loss = true;
      break;
    }
    if (at == 0) break;
    at = t.rfind(mark, at - 1);
  }
  // the result: the evaluation after training on the validation set (not the test set's line after it)
  const std::string valid = "on validation set | lm loss value: ";
  if (const size_t v = t.rfind(valid); v != std::string::npos) {
    p.valid_loss = std::atof(t.c_str() + v + valid.size());
    p.has_valid = true;
  }
  return p;
}

std::string failure_reason(const fs::path& log, int status) {
  // train's own error ("train: error: ...", "train (rank N): error: ..."), not a launcher's
  // line after it (mpirun's "MPI_ABORT ... with errorcode 1."); else any line that says error
  std::string train_error, reason;
  for_each_line(read_file_tail(log, 8192), [&](std::string_view line, size_t) {
    if (line.find("error") == std::string_view::npos) return;
    reason = std::string(line);
    if (line.substr(0, 5) == "train" && line.find("error: ") != std::string_view::npos) train_error = reason;
  });
  if (!train_error.empty()) return train_error;
  if (!reason.empty()) return reason;
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "exit status " + std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

std::vector<std::string> last_log_lines(const fs::path& log, size_t n, const std::string& except) {
  std::vector<std::string> lines;
  for_each_line(read_file_tail(log, 1500), [&](std::string_view l, size_t) {
    if (l != except) lines.emplace_back(l);
  });
  if (lines.size() > n) lines.erase(lines.begin(), lines.end() - static_cast<std::ptrdiff_t>(n));
  return lines;
}

// ---- checkpoints --------------------------------------------------------------------------

int64_t prune_checkpoints(const fs::path& dir, const std::string& keep) {
  const auto kept = checkpoints_kept(dir, keep);
  return kept ? io::remove_old_checkpoints(dir, *kept) : 0;
}

int64_t mark_done(const fs::path& point_dir, const std::string& keep, const json& record) {
  const int64_t freed = prune_checkpoints(point_dir / "checkpoints", keep);
  write_file_atomic(point_dir / "DONE", record.dump() + "\n");
  return freed;
}

int64_t prunable_checkpoint_bytes(const fs::path& dir, const std::string& keep) {
  const auto kept = checkpoints_kept(dir, keep);
  return kept ? io::old_checkpoint_bytes(dir, *kept) : 0;
}

}  // namespace megabatch::sweeps
