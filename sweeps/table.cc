#include "sweeps/table.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/io/metrics.h"
#include "sweeps/placement.h"

namespace megabatch::sweeps {

void read_finished_state(PointState& p) {
  if (std::filesystem::exists(p.dir / "DONE")) {
    p.state = PointStatus::kDone;
  } else if (std::filesystem::exists(p.dir / "DIVERGED")) {
    p.state = PointStatus::kDiverged;
    p.reason = divergence_reason(p.dir);
  } else if (const std::string why = failed_reason(p.dir); !why.empty()) {
    p.state = PointStatus::kFailed;  // under the launcher of an exported sweep
    p.reason = why;
  }
}

std::string unreadable_result(const PointState& p) {
  if (p.state != PointStatus::kDone && p.state != PointStatus::kDiverged) return "";
  return io::metrics_unreadable(p.dir / "metrics.h5");
}

int64_t work_of(const PointState& p) {
  if (p.state == PointStatus::kDone || p.state == PointStatus::kDiverged) return p.samples;
  return std::min(p.progress.consumed, p.samples);
}

std::string fmt_duration(double s) {
  char buf[32];
  if (s < 0 || !std::isfinite(s)) return "-";
  const int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(t / 3600), static_cast<long long>(t % 3600 / 60));
  else
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(t / 60), static_cast<long long>(t % 60));
  return buf;
}

std::vector<std::string> table_lines(const std::vector<PointState>& ps, double elapsed, double eta,
                                     const std::string& rerun_damaged) {
  int done = 0, running = 0, failed = 0, pending = 0, diverged = 0, started = 0, stopped = 0, damaged = 0;
  for (const auto& p : ps) {
    damaged += !p.damaged.empty();
    started += p.state == PointStatus::kStarted;
    stopped += p.state == PointStatus::kStopped;
    done += p.state == PointStatus::kDone;
    diverged += p.state == PointStatus::kDiverged;
    running += p.state == PointStatus::kRunning;
    failed += p.state == PointStatus::kFailed;
    pending += p.state == PointStatus::kPending || p.state == PointStatus::kInterrupted || p.state == PointStatus::kQueued;
  }
  std::vector<std::string> out;
  char buf[512];
  std::snprintf(buf, sizeof buf, "sweep: %d done, %d diverged, %d running, %d failed, %d waiting", done, diverged,
                running, failed, pending);
  std::string head = buf;
  // sweep status of an exported sweep (launchers/slurm): its launcher's points in progress
  if (started) head += ", " + std::to_string(started) + " started under their launcher";
  if (stopped) head += ", " + std::to_string(stopped) + " stopped (submit the sweep again to resume)";
  if (damaged)  // discarded and run again on request, by the command that runs the sweep's points
    head += ", " + std::to_string(damaged) + " result(s) lost (metrics.h5 unreadable; " + rerun_damaged + ")";
  if (elapsed >= 0) head += " | elapsed " + fmt_duration(elapsed) + " | ETA " + fmt_duration(eta);
  else head += " | point time " + fmt_duration(eta);
  out.push_back(head);
  size_t w = 5;
  for (const auto& p : ps) w = std::max(w, p.point->id.size());
  for (const auto& p : ps) {
    if (p.state == PointStatus::kSkipped) continue;
    std::string detail;
    if (p.progress.has_loss) {
      std::snprintf(buf, sizeof buf, "iter %lld/%lld  lm loss %.4f", static_cast<long long>(p.progress.iteration),
                    static_cast<long long>(p.train_iters), p.progress.loss);
      detail = buf;
    }
    if (p.progress.has_valid && p.state == PointStatus::kDone) {
      std::snprintf(buf, sizeof buf, "  final valid loss %.4f", p.progress.valid_loss);
      detail += buf;
    }
    if (p.state == PointStatus::kFailed || p.state == PointStatus::kDiverged) detail = p.reason;
    if (p.state == PointStatus::kStopped && !p.reason.empty()) detail = p.reason;  // before training
    if (!p.damaged.empty()) detail = "result lost: " + p.damaged;
    if (!p.slurm_job.empty()) detail = "slurm job " + p.slurm_job + (detail.empty() ? "" : "  " + detail);
    if (!p.gpus.empty()) detail = "gpu " + gpu_list(p.gpus) + "  " + detail;
    std::snprintf(buf, sizeof buf, "  %-*s  %-11s %s", static_cast<int>(w), p.point->id.c_str(), status_name(p.state),
                  detail.c_str());
    out.push_back(buf);
  }
  return out;
}

size_t terminal_width() {
  winsize w{};
  if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &w) == 0 && w.ws_col > 0) return w.ws_col;
  return 80;
}

std::string fit_width(const std::string& line, size_t width) {
  std::vector<size_t> starts;  // byte offset of each character
  for (size_t i = 0; i < line.size(); ++i)
    if ((static_cast<unsigned char>(line[i]) & 0xC0) != 0x80) starts.push_back(i);
  if (starts.size() <= width) return line;
  const size_t keep = width > 3 ? width - 3 : width;
  return line.substr(0, starts[keep]) + (width > 3 ? "..." : "");
}

}  // namespace megabatch::sweeps
