// core/util/files.h: whole-file reads that name the path, tails of logs, atomic writes.
#include <gtest/gtest.h>

#include <string>

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
  try {
    write_file_atomic(tmp / "no_such_dir" / "x.json", "x");
    FAIL() << "writing into a missing directory succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find((tmp / "no_such_dir" / "x.json.tmp").string()), std::string::npos) << e.what();
  }
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

}  // namespace
}  // namespace megabatch
