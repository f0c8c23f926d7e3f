#include "core/util/args.h"

#include <algorithm>
#include <iostream>
#include <sstream>

#include "core/util/error.h"
#include "core/util/numbers.h"

namespace megabatch {

namespace {
template <typename... Args>
[[noreturn]] void flag_error(Args&&... args) {
  throw FlagError(detail::concat(std::forward<Args>(args)...));
}

// read()'s value; to_int's or to_finite's refusal (it names the flag and what is wrong with the
// number) as a FlagError
template <typename Read>
auto as_flag_error(Read read) {
  try {
    return read();
  } catch (const Error& e) {
    throw FlagError(e.what());
  }
}
}  // namespace

void ArgParser::flag(const std::string& name, const std::string& help) {
  order_.push_back(name);
  specs_[name] = Spec{"", help, Spec::kFlag, {}, false};
}

void ArgParser::option(const std::string& name, const std::string& metavar, const std::string& help,
                       std::optional<std::string> default_value) {
  order_.push_back(name);
  Spec s{metavar, help, Spec::kValue, {}, default_value.has_value()};
  if (default_value) s.defaults = {*default_value};
  specs_[name] = std::move(s);
}

void ArgParser::list(const std::string& name, const std::string& metavar, const std::string& help,
                     std::vector<std::string> default_values) {
  order_.push_back(name);
  const bool has_default = !default_values.empty();
  specs_[name] = Spec{metavar, help, Spec::kList, std::move(default_values), has_default};
}

void ArgParser::optional_choice(const std::string& name, std::vector<std::string> choices, std::string implicit,
                                const std::string& help) {
  order_.push_back(name);
  std::string metavar = "[";
  for (const auto& c : choices) metavar += (metavar.size() > 1 ? "|" : "") + c;
  specs_[name] = Spec{metavar + "]", help, Spec::kOptionalChoice, {std::move(implicit)}, false, std::move(choices)};
}

std::string ArgParser::help_text() const {
  std::ostringstream os;
  os << usage_ << "\n\noptions:\n";
  for (const auto& name : order_) {
    const Spec& s = specs_.at(name);
    std::string left = "  --" + name + (s.metavar.empty() ? "" : " " + s.metavar);
    if (s.kind == Spec::kList) left += " ...";
    os << left;
    if (left.size() < 30) os << std::string(30 - left.size(), ' ');
    else os << "\n" << std::string(30, ' ');
    os << s.help;
    // the default, unless the help says it already, or it is empty (nothing given)
    const bool said = s.help.find("default") != std::string::npos;
    const bool empty = std::all_of(s.defaults.begin(), s.defaults.end(), [](const auto& d) { return d.empty(); });
    if (s.has_default && s.kind != Spec::kFlag && !said && !empty) {
      os << " (default:";
      for (const auto& d : s.defaults) os << ' ' << d;
      os << ')';
    }
    os << '\n';
  }
  os << "  --help                      show this help\n";
  return os.str();
}

bool ArgParser::parse(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << help_text();
      return false;
    }
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      positional_.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2), inline_value;
    bool has_inline = false;
    if (const auto eq = name.find('='); eq != std::string::npos) {
      inline_value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_inline = true;
    }
    // Megatron spells flags with dashes; accept underscores too.
    for (auto& ch : name) ch = ch == '_' ? '-' : ch;
    auto it = specs_.find(name);
    if (it == specs_.end()) flag_error(program_, ": unknown option --", name, "\n", usage_, "\n(see ", program_, " --help)");
    const Spec& s = it->second;
    auto& vals = values_[name];
    vals.clear();
    if (s.kind == Spec::kFlag) {
      if (has_inline) flag_error(program_, ": --", name, " takes no value");
      vals.push_back("1");
    } else if (s.kind == Spec::kOptionalChoice) {
      auto is_choice = [&](const std::string& v) { return std::find(s.choices.begin(), s.choices.end(), v) != s.choices.end(); };
      if (has_inline && !is_choice(inline_value)) flag_error(program_, ": --", name, ": expected one of ", s.metavar, ", got '", inline_value, "'");
      if (has_inline) vals.push_back(inline_value);
      else if (i + 1 < argc && is_choice(argv[i + 1])) vals.push_back(argv[++i]);
      else vals.push_back(s.defaults.front());
    } else if (has_inline) {
      vals.push_back(inline_value);
    } else if (s.kind == Spec::kValue) {
      if (i + 1 >= argc) flag_error(program_, ": --", name, " needs a value (", s.metavar, ")");
      vals.push_back(argv[++i]);
    } else {
      while (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) vals.push_back(argv[++i]);
      if (vals.empty()) flag_error(program_, ": --", name, " needs at least one value (", s.metavar, ")");
    }
  }
  return true;
}

bool ArgParser::has(const std::string& name) const { return values_.count(name) != 0; }

std::vector<std::string> ArgParser::get_list(const std::string& name) const {
  auto it = values_.find(name);
  if (it != values_.end()) return it->second;
  const Spec& s = specs_.at(name);
  if (!s.has_default) flag_error(program_, ": --", name, " is required (", s.help, ")");
  return s.defaults;
}

std::string ArgParser::get(const std::string& name) const { return get_list(name).front(); }

int64_t ArgParser::get_int(const std::string& name) const {
  return as_flag_error([&] { return to_int(get(name), program_ + ": --" + name); });
}

std::vector<int64_t> ArgParser::get_int_list(const std::string& name) const {
  return as_flag_error([&] {
    std::vector<int64_t> out;
    for (const std::string& value : get_list(name)) out.push_back(to_int(value, program_ + ": --" + name));
    return out;
  });
}

double ArgParser::get_double(const std::string& name) const {
  return as_flag_error([&] { return to_finite(get(name), program_ + ": --" + name); });
}

std::string ArgParser::get_choice(const std::string& name, const std::vector<std::string>& choices) const {
  std::string value = get(name), listed;
  for (const std::string& c : choices) {
    if (c == value) return value;
    listed += listed.empty() ? "" : ", ";
    listed += c;
  }
  flag_error(program_, ": --", name, ": expected one of ", listed, ", got '", value, "'");
}

}  // namespace megabatch
