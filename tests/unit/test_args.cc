// core/util/args.h: the programs' --help text.
#include <gtest/gtest.h>

#include <string>

#include "core/util/args.h"

namespace megabatch {
namespace {

// The line of `help` that starts with "  --name".
std::string line_of(const std::string& help, const std::string& name) {
  const size_t at = help.find("  --" + name + " ");
  if (at == std::string::npos) return "";
  return help.substr(at, help.find('\n', at) - at);
}

// An option's default is shown once: appended where the help does not give it, left out
// where the help says it in words (before, "points run at once (default: cores / threads)
// (default: 0)", the 0 being only the parser's "not given"), or where it is empty ("(default: )").
TEST(Args, HelpShowsEachDefaultOnceAndNoEmptyOne) {
  ArgParser a("prog", "usage: prog [options]");
  a.option("retries", "N", "attempts per point", "2");
  a.option("jobs", "N", "points run at once (default: cores / threads)", "0");
  a.option("vocab-file", "FILE", "the vocabulary", "");
  a.list("keys", "K", "JSON keys", {"text", "title"});
  a.flag("dry-run", "check only");
  const std::string help = a.help_text();
  EXPECT_EQ(line_of(help, "retries"), "  --retries N                 attempts per point (default: 2)");
  EXPECT_EQ(line_of(help, "jobs"), "  --jobs N                    points run at once (default: cores / threads)");
  EXPECT_EQ(line_of(help, "vocab-file"), "  --vocab-file FILE           the vocabulary");
  EXPECT_EQ(line_of(help, "keys"), "  --keys K ...                JSON keys (default: text title)");
  EXPECT_EQ(line_of(help, "dry-run"), "  --dry-run                   check only");
}

}  // namespace
}  // namespace megabatch
