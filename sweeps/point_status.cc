#include "sweeps/point_status.h"

#include <array>
#include <utility>

#include "core/util/error.h"

namespace megabatch::sweeps {

namespace {
constexpr std::array<std::pair<PointStatus, const char*>, 10> kNames = {{
    {PointStatus::kPending, "pending"},
    {PointStatus::kRunning, "running"},
    {PointStatus::kDone, "done"},
    {PointStatus::kDiverged, "diverged"},
    {PointStatus::kFailed, "failed"},
    {PointStatus::kInterrupted, "interrupted"},
    {PointStatus::kSkipped, "skipped"},
    {PointStatus::kStarted, "started"},
    {PointStatus::kQueued, "queued"},
    {PointStatus::kStopped, "stopped"},
}};
}  // namespace

const char* status_name(PointStatus s) {
  for (const auto& [status, name] : kNames)
    if (status == s) return name;
  return "?";
}

PointStatus parse_status(const std::string& name, const std::string& where) {
  std::string known;
  for (const auto& [status, n] : kNames) {
    if (name == n) return status;
    known += known.empty() ? n : std::string(", ") + n;
  }
  fail(where, ": a point's state is '", name, "', which is none of ", known);
}

}  // namespace megabatch::sweeps
