#include "sweeps/slurm_queue.h"

#include <cstdlib>
#include <vector>

#include "core/util/files.h"

namespace megabatch::sweeps {
namespace fs = std::filesystem;

namespace {

// "4" or "[2-5,7%4]": the array indices a task field names (empty where it is not an array's).
std::vector<int> array_indices(std::string_view spec) {
  std::vector<int> out;
  if (spec.empty()) return out;
  if (spec.front() != '[') {
    out.push_back(std::atoi(std::string(spec).c_str()));
    return out;
  }
  std::string body(spec.substr(1, spec.find(']') == std::string_view::npos ? std::string_view::npos : spec.find(']') - 1));
  body = body.substr(0, body.find('%'));  // "%4": the most that run at once
  size_t at = 0;
  while (at <= body.size()) {
    const size_t comma = std::min(body.find(',', at), body.size());
    const std::string part = body.substr(at, comma - at);
    const size_t dash = part.find('-');
    const int lo = std::atoi(part.c_str()), hi = dash == std::string::npos ? lo : std::atoi(part.c_str() + dash + 1);
    for (int i = lo; i <= hi && hi - lo < 1000000; ++i) out.push_back(i);
    at = comma + 1;
  }
  return out;
}

std::string comparable(const fs::path& p) {
  std::error_code ec;
  const fs::path c = fs::weakly_canonical(p, ec);
  return (ec ? p : c).lexically_normal().string();
}

}  // namespace

std::map<int, QueuedTask> parse_queue(std::string_view squeue_output, const fs::path& dir) {
  std::map<int, QueuedTask> out;
  const std::string want = comparable(dir);
  for_each_line(squeue_output, [&](std::string_view line, size_t) {
    const size_t a = line.find('|'), b = line.rfind('|');
    if (a == std::string_view::npos || a == b) return;
    const std::string_view id = line.substr(0, a), state = line.substr(b + 1);
    if (comparable(std::string(line.substr(a + 1, b - a - 1))) != want) return;
    const size_t underscore = id.find('_');
    if (underscore == std::string_view::npos) return;  // not an array's task
    const std::string job(id.substr(0, underscore));
    for (const int i : array_indices(id.substr(underscore + 1)))
      out[i] = {state == "RUNNING" || state == "COMPLETING" ? PointStatus::kRunning : PointStatus::kQueued, job + "_" + std::to_string(i)};
  });
  return out;
}

std::optional<std::map<int, QueuedTask>> slurm_queue(const fs::path& dir) {
  const auto r = read_command("squeue -h --me -o '%i|%Z|%T' 2>/dev/null");
  if (!r || r->status != 0) return std::nullopt;
  return parse_queue(r->text, dir);
}

}  // namespace megabatch::sweeps
