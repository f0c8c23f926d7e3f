// Helpers shared by the test programs: temporary directories, subprocesses, assets.
#pragma once

#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "core/util/error.h"
#include "core/util/files.h"
#include "core/util/threads.h"

namespace megabatch::testing {

// A fresh directory under the system temp dir, removed with the object.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "megabatch-test-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs a shell command, capturing stdout+stderr.
inline CommandResult run_command(const std::string& cmd) {
  CommandResult r;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// Shell: waits until `log` has a line matching `pattern` (grep's basic regular expression,
// in single quotes: no ' in it), for at most `seconds`: a deadline for a loaded machine, not
// a pace; the command after it finds out whether the line came. With `pid` (a shell
// expression such as "$pid"), also no longer than that process lives.
inline std::string wait_for_line(const std::string& log, const std::string& pattern, int seconds = 300,
                                 const std::string& pid = "") {
  return "for i in $(seq " + std::to_string(seconds * 50) + "); do grep -q '" + pattern + "' " + log +
         " 2>/dev/null && break; " + (pid.empty() ? "" : "kill -0 " + pid + " 2>/dev/null || break; ") +
         "sleep 0.02; done; ";
}

inline void write_text(const std::filesystem::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary);
  out << s;
}
inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A thread count for a test's train: `want`, or fewer on a machine (or under taskset) that
// gives this process fewer CPUs, which train refuses to oversubscribe.
// The table `train --profile-steps` prints (core/device/profile.h): the step's milliseconds
// and, per row (a family, the idle or outside-ops row), ms per step, share and count per step.
struct ProfileTable {
  double step_ms = -1;
  std::string clock;
  struct Row {
    double ms = 0, share = 0, count = 0;
  };
  std::map<std::string, Row> rows;  // without the sum line
};
inline ProfileTable parse_profile(const std::string& out) {
  ProfileTable t;
  std::smatch m;
  if (!std::regex_search(out, m, std::regex(R"(profile: [0-9]+ step\(s\) on [^,]+, ([^;]+) time; ([0-9.]+) ms a step)"))) return t;
  t.clock = m[1];
  t.step_ms = std::stod(m[2]);
  const std::regex line(R"(\n([A-Za-z][A-Za-z +()]+?) +([0-9.]+) +([0-9.]+)%(?: +([0-9.]+))?)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), line); it != std::sregex_iterator(); ++it) {
    if ((*it)[1] == "step (sum of the above)") continue;
    t.rows[(*it)[1]] = {std::stod((*it)[2]), std::stod((*it)[3]), (*it)[4].matched ? std::stod((*it)[4]) : 0.0};
  }
  return t;
}

inline int test_threads(int want = 2) { return std::min(want, ::megabatch::available_cpus()); }
inline std::string threads_flag(int want = 2) { return "--threads " + std::to_string(test_threads(want)) + " "; }

// The environment an Open MPI command line of the tests starts with: the tests run as root
// (allowed explicitly) on 2 cores (more ranks than cores allowed).
inline std::string mpi_env() {
  return "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 ";
}

// fn() must throw megabatch::Error with `needle` in its message.
template <typename Fn>
void expect_error(Fn&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected an error containing: " << needle;
  } catch (const ::megabatch::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// Where the sources and the binaries are: the build's, unless the environment says
// otherwise (a build packed by gpu-bundle.sh runs on another machine, in another place).
inline std::string source_dir() {
  const char* e = std::getenv("MEGABATCH_SOURCE_DIR");
  return e && *e ? e : MEGABATCH_SOURCE_DIR;
}
inline std::string bin_dir() {
  const char* e = std::getenv("MEGABATCH_BIN_DIR");
  return e && *e ? e : MEGABATCH_BIN_DIR;
}

// The default datasets (`preprocess brown`), made once per build for all its test programs
// (each ctest test is a process of its own, and about 130 of them train on these): in
// <build>/test-data/brown-<size>-<mtime>/, named by the preprocess that made it, so that a
// rebuilt preprocess makes them anew. The first test to ask makes them under a lock, in a
// directory renamed into place when complete: a test never reads them half written, and one
// killed while making them leaves only a directory the next maker removes. Tests only read
// them. Throws when preprocess fails.
inline const std::filesystem::path& brown_data() {
  namespace fs = std::filesystem;
  static const fs::path dir = [] {
    const std::string preprocess = bin_dir() + "/preprocess";
    struct stat st{};
    if (::stat(preprocess.c_str(), &st) != 0) throw std::runtime_error(preprocess + " is missing: build it first");
    const fs::path root = fs::path(bin_dir()).parent_path() / "test-data";
    const std::string name =
        "brown-" + std::to_string(st.st_size) + "-" + std::to_string(st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec);
    const fs::path made = root / name;
    if (fs::is_directory(made)) return made;
    fs::create_directories(root);
    const std::string lock_path = (root / ".lock").string();
    struct Lock {
      int fd;
      ~Lock() {
        if (fd >= 0) ::close(fd);  // (closing releases the lock)
      }
    } lock{::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)};
    if (lock.fd < 0 || ::flock(lock.fd, LOCK_EX) != 0) throw std::runtime_error("cannot lock " + lock_path);
    if (fs::is_directory(made)) return made;  // made by another test while this one waited
    std::vector<fs::path> old;  // an older preprocess's, or a killed maker's
    for (const auto& e : fs::directory_iterator(root))
      if (e.path().filename().string().rfind("brown-", 0) == 0) old.push_back(e.path());
    for (const auto& p : old) fs::remove_all(p);
    const fs::path part = root / (name + ".part");
    const auto r = run_command(preprocess + " brown --output-dir " + part.string());
    if (r.exit_code != 0) throw std::runtime_error("preprocess brown failed: " + r.output);
    fs::rename(part, made);
    return made;
  }();
  return dir;
}

// Fails the test (with the remedy) when setup.sh has not installed the assets.
#define MB_REQUIRE_ASSET(rel)                                                               \
  do {                                                                                      \
    if (!std::filesystem::exists(::megabatch::asset_dir() / (rel)))                         \
      FAIL() << "asset " << (::megabatch::asset_dir() / (rel)).string()                     \
             << " is missing: run ./setup.sh (the test command in README.md does)";         \
  } while (0)

}  // namespace megabatch::testing
