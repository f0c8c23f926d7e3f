// core/util/files.h: whole-file reads that name the path, tails of logs, atomic writes;
// core/util/dir_lock.h: one writer per directory.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/util/dir_lock.h"
#include "core/util/error.h"
#include "core/util/files.h"
#include "tests/unit/test_util.h"

namespace megabatch {
namespace {

namespace fs = std::filesystem;

TEST(Files, TailIsTheLastBytesTheWholeShortFileOrNothingForAMissingOne) {
  testing::TempDir tmp;
  const fs::path log = tmp / "stdout.log";
  testing::write_text(log, "first line\nsecond line\n");
  EXPECT_EQ(read_file_tail(log, 12), "second line\n");
  EXPECT_EQ(read_file_tail(log, 1000), "first line\nsecond line\n");
  EXPECT_EQ(read_file_tail(log, 0), "");
  EXPECT_EQ(read_file_tail(tmp / "not_there.log", 100), "");
  testing::write_text(log, "");
  EXPECT_EQ(read_file_tail(log, 100), "");
}

TEST(Files, WriteFileAtomicReplacesTheWholeFileAndLeavesNoTemporary) {
  testing::TempDir tmp;
  const fs::path f = tmp / "state.json";
  write_file_atomic(f, "a longer first version\n");
  write_file_atomic(f, "short\n");
  EXPECT_EQ(read_file(f), "short\n");
  EXPECT_FALSE(fs::exists(tmp / "state.json.tmp"));
}

// The errors name the path given and what to do, not only the temporary file's name.
TEST(Files, WriteFileAtomicSaysWhyItCannotWriteThePathGiven) {
  testing::TempDir tmp;
  testing::write_text(tmp / "a_file", "x");
  const std::vector<std::pair<fs::path, std::string>> cases = {
      {tmp / "no_such_dir" / "x.json", (tmp / "no_such_dir" / "x.json").string() + ": cannot write it: " +
                                           (tmp / "no_such_dir").string() + " does not exist; create it first"},
      {tmp / "a_file" / "x.json", (tmp / "a_file" / "x.json").string() +
                                      ": cannot write it: " + (tmp / "a_file").string() + " is not a directory"},
      {tmp.path(), tmp.path().string() + ": is a directory; give the path of a file to write"},
  };
  for (const auto& [path, want] : cases) testing::expect_error([&] { write_file_atomic(path, "x"); }, want);
  EXPECT_EQ(read_file(tmp / "a_file"), "x");
  EXPECT_FALSE(fs::exists(tmp.path().string() + ".tmp")) << "a temporary file was left beside the directory";
}

TEST(Files, ReadFileNamesThePathAndWhatItWasMeantToBe) {
  testing::TempDir tmp;
  try {
    read_file(tmp / "missing.json", "sweep state");
    FAIL() << "reading a missing file succeeded";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find((tmp / "missing.json").string() + ": cannot open sweep state"), std::string::npos) << m;
  }
  try {
    read_file(tmp.path(), "sweep state");
    FAIL() << "reading a directory succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a regular file; give the path of the sweep state"), std::string::npos)
        << e.what();
  }
}

// The lock is flock(2) on DIR/.megabatch.lock: a second holder, in this process or another
// (util-linux's flock(1) here), is refused while the first lives, and the message names the
// first and says what the refused one should do; when the first goes, the lock is free again.
TEST(DirLock, ASecondHolderIsRefusedNamingTheFirstUntilTheFirstEnds) {
  testing::TempDir tmp;
  const fs::path dir = tmp / "runs" / "train";  // made by the lock
  const std::string other_process = "flock -n " + (dir / DirLock::kFile).string() + " -c 'echo free'";
  std::optional<DirLock> first;
  first.emplace(dir, "first holder", "unused");
  ASSERT_TRUE(first->held());
  EXPECT_TRUE(fs::is_directory(dir));
  try {
    DirLock second(dir, "second holder", "what the second should do");
    FAIL() << "a second lock on " << dir << " was granted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind(dir.string() + " is in use by first holder (pid " + std::to_string(::getpid()) + " on host ", 0), 0u)
        << m;
    EXPECT_NE(m.find(" UTC): what the second should do"), std::string::npos) << m;
  }
  auto r = testing::run_command(other_process);
  EXPECT_NE(r.exit_code, 0) << "another process took the lock: " << r.output;
  EXPECT_EQ(r.output.find("free"), std::string::npos) << r.output;

  first.reset();
  r = testing::run_command(other_process);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "free\n");
  DirLock again(dir, "second holder", "unused");
  EXPECT_TRUE(again.held());
  EXPECT_EQ(read_file(dir / DirLock::kFile).rfind("second holder (pid ", 0), 0u) << "the file names the holder now";
}

// A holder on another host may be a node that died, whose lock a network filesystem keeps
// until its lease runs out: that one is waited for (refused after the wait, with the wait
// said), and the lock is taken as soon as it is let go.
TEST(DirLock, AHolderOnAnotherHostIsWaitedForAndTheLockTakenWhenItGoes) {
  testing::TempDir tmp;
  const fs::path dir = tmp / "run";
  std::optional<DirLock> first;
  first.emplace(dir, "train", "unused");
  const std::string elsewhere = "train (pid 4242 on host node-that-died since 2026-11-25 00:00:00 UTC)";
  testing::write_text(dir / DirLock::kFile, elsewhere + "\n");  // the lock is the flock, not the text

  auto t0 = std::chrono::steady_clock::now();
  try {
    DirLock second(dir, "train", "what to do", 1);
    FAIL() << "a second lock on " << dir << " was granted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), dir.string() + " is in use by " + elsewhere + " (waited 1 s): what to do");
  }
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1)) << "refused without waiting";

  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    first.reset();
  });
  t0 = std::chrono::steady_clock::now();
  DirLock second(dir, "train", "unused", 30);
  const auto waited = std::chrono::steady_clock::now() - t0;
  release.join();
  EXPECT_TRUE(second.held());
  EXPECT_GE(waited, std::chrono::milliseconds(1500));
  EXPECT_LT(waited, std::chrono::seconds(10)) << "taken soon after the holder let go";
}

}  // namespace
}  // namespace megabatch
