// core/util/args.h: the programs' --help text, and what a bad command line throws.
#include <gtest/gtest.h>

#include <string>
#include <vector>

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

// argv from words (ArgParser reads argv[1..])
struct Argv {
  std::vector<std::string> words;
  std::vector<char*> ptrs;
  explicit Argv(std::vector<std::string> w) : words(std::move(w)) {
    for (auto& x : words) ptrs.push_back(x.data());
  }
  int argc() const { return static_cast<int>(ptrs.size()); }
  char** argv() { return ptrs.data(); }
};

// The message of the FlagError that f throws ("" if it throws none, or another kind).
template <typename F>
std::string flag_error_of(F f) {
  try {
    f();
  } catch (const FlagError& e) {
    return e.what();
  } catch (...) {
    return "(another exception)";
  }
  return "";
}

ArgParser bench_like() {
  ArgParser a("prog", "usage: prog");
  a.list("seqs", "T", "sequence lengths", {"512", "1024"});
  a.option("reps", "N", "calls", "20");
  a.option("dropout", "P", "probability", "0");
  a.option("torch", "BOOL", "also PyTorch", "true");
  a.option("needed", "X", "no default");
  return a;
}

// Values read back: integer lists in order, choices as given, defaults where nothing is given.
TEST(Args, IntListsAndChoicesReadBack) {
  ArgParser a = bench_like();
  Argv v({"prog", "--seqs", "7", "+9", "4096", "--torch=false"});
  ASSERT_TRUE(a.parse(v.argc(), v.argv()));
  EXPECT_EQ(a.get_int_list("seqs"), (std::vector<int64_t>{7, 9, 4096}));
  EXPECT_EQ(a.get_choice("torch", {"true", "false"}), "false");
  EXPECT_EQ(a.get_int("reps"), 20);
  ArgParser b = bench_like();
  Argv none({"prog"});
  ASSERT_TRUE(b.parse(none.argc(), none.argv()));
  EXPECT_EQ(b.get_int_list("seqs"), (std::vector<int64_t>{512, 1024}));
}

// Every refusal of the command line is a FlagError (a main tells it from the program's other
// errors) whose message starts with the program and names the flag and the value.
TEST(Args, EveryBadCommandLineIsAFlagErrorNamingProgramAndFlag) {
  ArgParser a = bench_like();
  Argv v({"prog", "--seqs", "512", "1k", "--reps", "x", "--dropout", "0.1.2", "--torch", "yes"});
  ASSERT_TRUE(a.parse(v.argc(), v.argv()));
  EXPECT_EQ(flag_error_of([&] { a.get_int_list("seqs"); }),
            "prog: --seqs: expected an integer, got '1k' (trailing text 'k')");
  EXPECT_EQ(flag_error_of([&] { a.get_int("reps"); }), "prog: --reps: expected an integer, got 'x' (not an integer)");
  EXPECT_EQ(flag_error_of([&] {
              a.get_double("dropout");
            }).rfind("prog: --dropout: expected a finite number, got '0.1.2'", 0),
            0u);
  EXPECT_EQ(flag_error_of([&] {
              a.get_choice("torch", {"true", "false"});
            }),
            "prog: --torch: expected one of true, false, got 'yes'");
  EXPECT_EQ(flag_error_of([&] { a.get("needed"); }), "prog: --needed is required (no default)");
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"prog", "--sqes", "1"}, "prog: unknown option --sqes\nusage: prog\n"},
      {{"prog", "--reps"}, "prog: --reps needs a value (N)"},
      {{"prog", "--seqs", "--reps", "1"}, "prog: --seqs needs at least one value (T)"},
      {{"prog", "--torch=yes=no"}, ""},  // a value with '=' in it is the value: refused when read, not here
  };
  for (const auto& [words, says] : bad) {
    ArgParser b = bench_like();
    Argv w(words);
    EXPECT_EQ(flag_error_of([&] { b.parse(w.argc(), w.argv()); }).substr(0, says.size()), says) << words[1];
  }
}

}  // namespace
}  // namespace megabatch
