// Fuzz target: what `sweep status` (and `sweep run` when it resumes) reads back from a sweep
// directory that an earlier run, perhaps killed mid-write or edited by hand, left behind.
// The input up to its first NUL byte is written as runs/<name>/sweep.json, the rest as the
// stdout.log, DIVERGED and point.json of a point "p" made by the sweep tool. Reading them must
// print a status or throw megabatch::Error naming the file; a crash or any other exception
// is a bug.
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>

#include "core/util/error.h"
#include "sweeps/run_dir.h"
#include "sweeps/status.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fs = std::filesystem;
  using namespace megabatch;
  static const fs::path sweep = [] {
    const fs::path d = fuzz::scratch_dir() / "runs" / "s";
    sweeps::make_point_dir(d / "p");
    return d;
  }();
  const std::string in(reinterpret_cast<const char*>(data), size);
  const size_t nul = std::min(in.find('\0'), in.size());
  const std::string state = in.substr(0, nul), log = nul < in.size() ? in.substr(nul + 1) : std::string();
  fuzz::write_bytes(sweep / "sweep.json", reinterpret_cast<const uint8_t*>(state.data()), state.size());
  for (const char* name : {"stdout.log", "DIVERGED", "point.json"})
    fuzz::write_bytes(sweep / "p" / name, reinterpret_cast<const uint8_t*>(log.data()), log.size());

  (void)sweeps::parse_progress(sweep / "p" / "stdout.log");
  (void)sweeps::failure_reason(sweep / "p" / "stdout.log", 0);
  (void)sweeps::last_log_lines(sweep / "p" / "stdout.log", 3, "");
  (void)sweeps::divergence_reason(sweep / "p");
  (void)sweeps::config_changes(sweep / "p", nlohmann::json{{"lr", 0.002}, {"seed", 3}});
  std::ostringstream table;  // print_status writes to std::cout
  std::streambuf* const cout = std::cout.rdbuf(table.rdbuf());
  try {
    (void)sweeps::print_status(sweep);
  } catch (const Error&) {
  } catch (...) {
    std::cout.rdbuf(cout);
    throw;
  }
  std::cout.rdbuf(cout);
  return 0;
}
