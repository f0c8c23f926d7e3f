// Run configuration: a typed schema of options, read from a JSON file (--config FILE,
// keys in snake_case) and then from Megatron-style flags (--num-layers 4, which override
// the file). Unknown or ill-typed options are Errors that give the JSON path or flag and
// the nearest valid name.
#pragma once

#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace megabatch::config {

enum class Type { kInt, kFloat, kString, kBool, kIntList, kStringList, kObject };

struct Option {
  std::string name;          // snake_case; the flag is --name-with-dashes
  Type type;
  nlohmann::json default_value;  // null: no default (absent unless given)
  std::string help;
  std::string group;
};

class Schema {
 public:
  Schema(std::string program, std::vector<Option> options) : program_(std::move(program)), options_(std::move(options)) {}
  const Option* find(const std::string& name) const;
  const std::vector<Option>& options() const { return options_; }
  std::string help() const;  // grouped option list
  std::vector<std::string> names() const;

 private:
  std::string program_;
  std::vector<Option> options_;
};

struct Resolved {
  nlohmann::json values;            // every option with a value (defaults filled in)
  std::set<std::string> explicit_;  // names given in the file or on the command line
  bool help = false;                // --help was given
  bool given(const std::string& name) const { return explicit_.count(name) > 0; }
};

// The flag of an option without its dashes: "loss_scale" -> "loss-scale".
std::string flag_name(const std::string& option);

// Parses argv[first..argc): "--config FILE" first (its keys), then every flag in order.
// Flags: "--name value", "--name=value", "--flag" for booleans, lists take values up to
// the next "--"; an object option takes "key=value" (value parsed as JSON, else string).
Resolved resolve(const Schema& schema, int argc, char** argv, int first = 1);
// The same from a JSON object alone; `where` names the source in errors.
Resolved resolve_json(const Schema& schema, const nlohmann::json& j, const std::string& where);

}  // namespace megabatch::config
