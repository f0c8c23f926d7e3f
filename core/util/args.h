// A small command-line parser for Megatron-style flags: "--name value", "--name=value",
// boolean "--flag", and lists ("--json-keys text title"). Unknown flags, missing values
// and malformed numbers are FlagErrors that name the program and the flag.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/util/error.h"

namespace megabatch {

// What ArgParser throws for a bad command line: an unknown flag, a flag without its value, a
// value that is not a number or not one of the choices. The message begins with the program's
// name ("attention_bench: --seqs: expected an integer, got 'abc' (not an integer)"), so a main
// prints it as it is; exit status 2 by convention.
class FlagError : public Error {
 public:
  using Error::Error;
};

class ArgParser {
 public:
  ArgParser(std::string program, std::string usage) : program_(std::move(program)), usage_(std::move(usage)) {}

  // Declares options; `help` is shown by --help. A list option takes one or more values.
  void flag(const std::string& name, const std::string& help);
  void option(const std::string& name, const std::string& metavar, const std::string& help,
              std::optional<std::string> default_value = std::nullopt);
  void list(const std::string& name, const std::string& metavar, const std::string& help,
            std::vector<std::string> default_values = {});
  // An option whose value may be left out: "--name" alone means `implicit`, "--name WORD"
  // takes WORD only when it is one of `choices` (so a positional argument after it stays
  // positional), "--name=WORD" must be one of them.
  void optional_choice(const std::string& name, std::vector<std::string> choices, std::string implicit,
                       const std::string& help);

  // Parses argv[first..argc). Returns false when --help was given (help already printed).
  bool parse(int argc, char** argv, int first = 1);

  bool has(const std::string& name) const;  // given on the command line (or a flag set)
  std::string get(const std::string& name) const;  // value or default; Error if neither
  std::vector<std::string> get_list(const std::string& name) const;
  int64_t get_int(const std::string& name) const;  // FlagError naming the flag if not an integer
  std::vector<int64_t> get_int_list(const std::string& name) const;
  double get_double(const std::string& name) const;
  // The value, which must be one of `choices` (FlagError listing them if not).
  std::string get_choice(const std::string& name, const std::vector<std::string>& choices) const;
  const std::vector<std::string>& positional() const { return positional_; }
  std::string help_text() const;

 private:
  struct Spec {
    std::string metavar, help;
    enum Kind { kFlag, kValue, kList, kOptionalChoice } kind;
    std::vector<std::string> defaults;  // kOptionalChoice: the implicit value
    bool has_default = false;
    std::vector<std::string> choices = {};
  };
  std::string program_, usage_;
  std::vector<std::string> order_;
  std::map<std::string, Spec> specs_;
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> positional_;
};

}  // namespace megabatch
