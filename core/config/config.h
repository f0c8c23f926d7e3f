// Run configuration: a typed schema of options, read from a JSON file (--config FILE,
// keys in snake_case) and then from Megatron-style flags (--num-layers 4, which override
// the file). Unknown or ill-typed options are Errors that give the JSON path or flag and
// the nearest valid name. Numbers must be finite and in the option's range; an integer
// option takes a JSON integer (not 2.0, not 1e30) within int64.
#pragma once

#include <limits>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace megabatch::config {

enum class Type { kInt, kFloat, kString, kBool, kIntList, kStringList, kObject };

// The values a number option accepts (numbers are always finite): lo..hi, each end
// closed unless marked open.
struct Range {
  double lo = -std::numeric_limits<double>::infinity(), hi = std::numeric_limits<double>::infinity();
  bool lo_open = false, hi_open = false;
  std::string text() const;  // ">= 1", "in [0, 1)", ...
};
inline Range at_least(double lo) { return {lo, std::numeric_limits<double>::infinity(), false, false}; }
inline Range above(double lo) { return {lo, std::numeric_limits<double>::infinity(), true, false}; }
inline Range within(double lo, double hi, bool hi_open = false) { return {lo, hi, false, hi_open}; }

struct Option {
  std::string name;          // snake_case; the flag is --name-with-dashes
  Type type;
  nlohmann::json default_value;  // null: no default (absent unless given)
  std::string help;
  std::string group;
  Range range = {};          // numbers (and integer lists): the accepted values
};

// A flag of another program (Megatron-LM's) that is no option here, but known: a script
// written for that program passes it. It is taken, with nothing to do, where `done` says why
// nothing needs doing here (for any value, or only for `values`); else it is refused with
// `refused` (why, and what to do instead). Either way it gives Resolved::values nothing.
struct ForeignFlag {
  std::string name;                 // snake_case, as an option's
  int arity = 0;                    // values it takes: 0 (a switch) or 1
  std::string done;                 // why taking it needs nothing done here; "": always refused
  std::vector<std::string> values;  // `done` holds for these values only ({}: for any)
  std::string refused;              // why it is refused, and what to do instead
};

class Schema {
 public:
  Schema(std::string program, std::vector<Option> options, std::vector<ForeignFlag> foreign = {})
      : program_(std::move(program)), options_(std::move(options)), foreign_(std::move(foreign)) {}
  const Option* find(const std::string& name) const;
  const ForeignFlag* find_foreign(const std::string& name) const;
  const std::vector<Option>& options() const { return options_; }
  std::string help() const;  // grouped option list
  std::vector<std::string> names() const;

 private:
  std::string program_;
  std::vector<Option> options_;
  std::vector<ForeignFlag> foreign_;
};

struct Resolved {
  nlohmann::json values;            // every option with a value (defaults filled in)
  std::set<std::string> explicit_;  // names given in the file or on the command line
  bool help = false;                // --help was given
  std::vector<std::string> foreign_taken;  // "--flag [value]: why nothing is to be done", in order given
  bool given(const std::string& name) const { return explicit_.count(name) > 0; }
};

// The flag of an option without its dashes: "loss_scale" -> "loss-scale".
std::string flag_name(const std::string& option);

// Parses argv[first..argc): "--config FILE" first (its keys), then every flag in order.
// Flags: "--name value", "--name=value", "--flag" for booleans, lists take values up to
// the next "--"; an object option takes "key=value" (value parsed as JSON, else string).
// Unknown and refused foreign flags are all said in one Error (each on a line of its own
// where there are several).
Resolved resolve(const Schema& schema, int argc, char** argv, int first = 1);
// The same from a JSON object alone; `where` names the source in errors.
Resolved resolve_json(const Schema& schema, const nlohmann::json& j, const std::string& where);

}  // namespace megabatch::config
