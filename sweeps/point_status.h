// Where a point of a sweep stands. `sweep run` takes a point from pending to running, then
// to done, diverged, failed or interrupted (skipped: left out by --only); `sweep status` also
// tells started (an exported point its launcher has begun) and, from Slurm's queue
// (slurm_queue.h), queued and stopped. One place names them (status_name) and one reads them
// back from a sweep's state file (parse_status).
#pragma once

#include <string>

namespace megabatch::sweeps {

enum class PointStatus { kPending, kRunning, kDone, kDiverged, kFailed, kInterrupted, kSkipped, kStarted, kQueued, kStopped };

// Its name as the tables and the sweep's state file write it ("done").
const char* status_name(PointStatus s);
// The status of `name`, read from `where` (a sweep's state file): an Error naming both, and
// the names there are, for any other.
PointStatus parse_status(const std::string& name, const std::string& where);

}  // namespace megabatch::sweeps
