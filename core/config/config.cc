#include "core/config/config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <sstream>

#include "core/util/error.h"
#include "core/util/files.h"
#include "core/util/json.h"
#include "core/util/numbers.h"
#include "core/util/strings.h"

namespace megabatch::config {
using nlohmann::json;

namespace {
std::string flag_of(const std::string& name) {
  std::string f = "--" + name;
  for (char& c : f)
    if (c == '_') c = '-';
  return f;
}
std::string name_of(std::string flag) {
  flag = flag.substr(2);
  for (char& c : flag)
    if (c == '-') c = '_';
  return flag;
}
const char* type_name(Type t) {
  switch (t) {
    case Type::kInt: return "an integer";
    case Type::kFloat: return "a number";
    case Type::kString: return "a string";
    case Type::kBool: return "true or false";
    case Type::kIntList: return "a list of integers";
    case Type::kStringList: return "a list of strings";
    case Type::kObject: return "an object";
  }
  return "?";
}

// A number of option o within its range, or an Error naming `where`.
void check_range(const Option& o, double x, const std::string& shown, const std::string& where) {
  const Range& r = o.range;
  check(std::isfinite(x), where, ": ", std::isnan(x) ? "nan" : (x > 0 ? "inf" : "-inf"), " is not a finite number");
  const bool ok = (r.lo_open ? x > r.lo : x >= r.lo) && (r.hi_open ? x < r.hi : x <= r.hi);
  check(ok, where, ": ", shown, " is out of range: ", o.name, " must be ", r.text());
}

// Checks (and normalizes) a JSON value for option o; `where` is the JSON path or flag.
json typed(const Option& o, const json& v, const std::string& where) {
  auto bad = [&]() {
    fail(where, ": expected ", type_name(o.type), ", got ", v.dump(-1, ' ', false, json::error_handler_t::replace),
         o.type == Type::kInt && v.is_number_float() ? " (an integer option takes a whole number without a decimal point or exponent)" : "");
  };
  auto integer = [&](const json& e) -> json {
    // is_number_unsigned values above INT64_MAX do not fit
    if (!e.is_number_integer() || (e.is_number_unsigned() && e.get<uint64_t>() > uint64_t{INT64_MAX})) {
      if (e.is_number_unsigned()) fail(where, ": ", e.dump(), " is too large for an integer option");
      bad();
    }
    check_range(o, static_cast<double>(e.get<int64_t>()), e.dump(), where);
    return e;
  };
  switch (o.type) {
    case Type::kInt:
      return integer(v);
    case Type::kFloat:
      if (!v.is_number()) bad();
      check_range(o, v.get<double>(), v.dump(), where);
      return json(v.get<double>());
    case Type::kString:
      if (v.is_string()) return v;
      bad();
      break;
    case Type::kBool:
      if (v.is_boolean()) return v;
      bad();
      break;
    case Type::kIntList:
    case Type::kStringList: {
      json arr = v.is_array() ? v : json::array({v});
      for (const auto& e : arr) {
        if (o.type == Type::kIntList)
          integer(e);
        else if (!e.is_string())
          bad();
      }
      return arr;
    }
    case Type::kObject:
      if (v.is_object()) return v;
      bad();
      break;
  }
  return v;
}

// A flag's text value as JSON of the option's type.
json parse_text(const Option& o, const std::string& text, const std::string& where) {
  if (const size_t bad = invalid_utf8_at(text); bad != std::string::npos)
    fail(where, ": the value is not valid UTF-8 (byte ", bad, " of '",
         json(text.substr(0, bad)).dump(), "...'); options are UTF-8 text");
  auto number = [&](bool integer) -> json {
    std::string why;
    if (integer) {
      if (const auto x = parse_int(text, &why)) return json(*x);
    } else {
      if (const auto x = parse_finite(text, &why)) return json(*x);
      if (why == "not finite") fail(where, ": ", text, " is not a finite number");
    }
    fail(where, ": expected ", integer ? "an integer" : "a number", ", got '", text, "' (", why, ")");
  };
  switch (o.type) {
    case Type::kInt: return number(true);
    case Type::kFloat: return number(false);
    case Type::kBool:
      if (text == "true" || text == "1") return true;
      if (text == "false" || text == "0") return false;
      fail(where, ": expected true or false, got '", text, "'");
    default: return json(text);
  }
}
}  // namespace

std::string Range::text() const {
  std::ostringstream os;
  const bool has_lo = std::isfinite(lo), has_hi = std::isfinite(hi);
  if (has_lo && has_hi)
    os << "in " << (lo_open ? '(' : '[') << lo << ", " << hi << (hi_open ? ')' : ']');
  else if (has_lo)
    os << (lo_open ? "> " : ">= ") << lo;
  else if (has_hi)
    os << (hi_open ? "< " : "<= ") << hi;
  else
    os << "finite";
  return os.str();
}

std::string flag_name(const std::string& option) { return flag_of(option).substr(2); }

const Option* Schema::find(const std::string& name) const {
  for (const auto& o : options_)
    if (o.name == name) return &o;
  return nullptr;
}

const ForeignFlag* Schema::find_foreign(const std::string& name) const {
  for (const auto& f : foreign_)
    if (f.name == name) return &f;
  return nullptr;
}

std::vector<std::string> Schema::names() const {
  std::vector<std::string> n;
  for (const auto& o : options_) n.push_back(o.name);
  return n;
}

std::string Schema::help() const {
  std::ostringstream os;
  std::string group;
  for (const auto& o : options_) {
    if (o.group != group) {
      group = o.group;
      os << "\n" << group << ":\n";
    }
    std::string left = "  " + flag_of(o.name);
    if (o.type == Type::kObject)
      left += " KEY=VALUE";
    else if (o.type == Type::kIntList || o.type == Type::kStringList)
      left += " V...";
    else if (o.type != Type::kBool)
      left += " V";
    if (left.size() < 34) left.resize(34, ' ');
    else left += "  ";
    os << left << o.help;
    if (!o.default_value.is_null() && !(o.type == Type::kBool && !o.default_value.get<bool>()))
      os << " (default " << o.default_value.dump() << ")";
    os << "\n";
  }
  // the foreign flags, by name (a wrapped list each): taken, then refused
  for (const bool taken : {true, false}) {
    std::vector<std::string> names;
    for (const auto& f : foreign_) {
      if (taken == f.done.empty()) continue;
      names.push_back(flag_of(f.name) + (taken && !f.values.empty() ? " " + join(f.values, "|") : ""));
    }
    if (names.empty()) continue;
    os << "\n"
       << (taken ? "Megatron-LM flags taken, with nothing to do (a note says why):"
                 : "Megatron-LM flags refused (the error says why and what to do instead):");
    size_t column = 80;
    for (size_t k = 0; k < names.size(); ++k) {
      const std::string item = names[k] + (k + 1 < names.size() ? "," : "");
      if (column + 1 + item.size() > 100) {
        os << "\n ";
        column = 1;
      }
      os << " " << item;
      column += 1 + item.size();
    }
    os << "\n";
  }
  return os.str();
}

namespace {
// Foreign flag f given as `shown` ("--flag" or "--flag value") with `value` (of a flag with
// one): noted in r where it needs nothing done, else its refusal, said after `named`.
void take_foreign(const ForeignFlag& f, const std::string& shown, const std::string& value, const std::string& named,
                  Resolved& r, std::vector<std::string>& refused) {
  if (!f.done.empty() && (f.values.empty() || std::find(f.values.begin(), f.values.end(), value) != f.values.end()))
    r.foreign_taken.push_back(shown + named + " needs nothing here: " + f.done);
  else
    refused.push_back(shown + named + " (Megatron-LM's) is not taken here: " + f.refused);
}

[[noreturn]] void fail_refused(const std::vector<std::string>& refused) {
  if (refused.size() == 1) fail(refused[0]);
  fail(refused.size(), " of the options cannot be taken; drop or change each:\n  ", join(refused, "\n  "));
}
}  // namespace

Resolved resolve_json(const Schema& schema, const json& j, const std::string& where) {
  Resolved r;
  for (const auto& o : schema.options())
    if (!o.default_value.is_null()) r.values[o.name] = o.default_value;
  check(j.is_object(), where, ": expected a JSON object of options");
  std::vector<std::string> refused;  // unknown keys, refused foreign ones: said together at the end
  for (const auto& [key, v] : j.items()) {
    const Option* o = schema.find(key);
    if (const ForeignFlag* f = o ? nullptr : schema.find_foreign(key)) {
      // a switch: true asks for it (false is Megatron's default: nothing asked); else its value
      const std::string path = where + "." + key;
      check(f->arity == 1 || v.is_boolean(), path, ": expected true or false, got ", v.dump());
      check(f->arity == 0 || v.is_string() || v.is_number(), path, ": expected a string or a number, got ", v.dump());
      if (f->arity == 0 && !v.get<bool>()) continue;
      const std::string value = f->arity == 0 ? "" : v.is_string() ? v.get<std::string>() : v.dump();
      take_foreign(*f, flag_of(key) + (value.empty() ? "" : " " + value), value, " (" + path + ")", r, refused);
      continue;
    }
    if (!o) {
      refused.push_back(where + ": unknown option '" + key + "'" + did_you_mean(key, schema.names()));
      continue;
    }
    if (o->name == "config") fail(where, ": 'config' cannot appear inside a config file");
    r.values[key] = typed(*o, v, where + "." + key);
    r.explicit_.insert(key);
  }
  if (!refused.empty()) fail_refused(refused);
  return r;
}

namespace {
// --config FILE (or --config=FILE) among the arguments: the file's options and its path
// ({} and "" when there is none).
std::pair<json, std::string> config_file(int argc, char** argv, int first) {
  json values = json::object();
  std::string where;
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--config" || a.rfind("--config=", 0) == 0) {
      std::string path;
      if (a == "--config") {
        check(i + 1 < argc, "--config: expected a file name");
        path = argv[i + 1];
      } else {
        path = a.substr(9);
      }
      values = parse_json_or_fail(read_file(path, "config file"), path);
      where = path;
    }
  }
  return {values, where};
}

// The value of flag `a` (option o) from the arguments at i (advanced past what it takes).
json flag_value(const Option& o, const std::string& a, bool has_inline, const std::string& value, int& i, int argc,
                char** argv, const json& current) {
  auto next_value = [&]() -> std::string {
    if (has_inline) return value;
    check(i + 1 < argc, a, ": expected a value");
    return argv[++i];
  };
  switch (o.type) {
    case Type::kBool:
      return has_inline ? parse_text(o, value, a) : json(true);
    case Type::kIntList:
    case Type::kStringList: {
      json arr = json::array();
      if (has_inline) {
        arr.push_back(value);
      } else {
        while (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) arr.push_back(std::string(argv[++i]));
      }
      check(!arr.empty(), a, ": expected at least one value");
      Option scalar = o;
      scalar.type = o.type == Type::kIntList ? Type::kInt : Type::kString;
      for (auto& e : arr) e = typed(scalar, parse_text(scalar, e.get<std::string>(), a), a);
      return arr;
    }
    case Type::kObject: {  // KEY=VALUE into the object
      const std::string kv = parse_text(Option{o.name, Type::kString, nullptr, "", ""}, next_value(), a).get<std::string>();
      const size_t eq = kv.find('=');
      check(eq != std::string::npos && eq > 0, a, ": expected KEY=VALUE, got '", kv, "'");
      // a JSON value where it is one (0.9, true, [1,2]), else the text as a string
      auto parsed = parse_json(kv.substr(eq + 1));
      json obj = current.is_object() ? current : json::object();
      obj[kv.substr(0, eq)] = parsed ? std::move(*parsed) : json(kv.substr(eq + 1));
      return obj;
    }
    default:
      return typed(o, parse_text(o, next_value(), a), a);
  }
}
}  // namespace

Resolved resolve(const Schema& schema, int argc, char** argv, int first) {
  // Locate --config first: the file is the base, flags override it.
  const auto [file_values, file_where] = config_file(argc, argv, first);
  Resolved r = resolve_json(schema, file_values, file_where.empty() ? "config" : file_where);
  if (!file_where.empty()) r.values["config"] = file_where;
  std::vector<std::string> refused;  // unknown flags, refused foreign ones: said together at the end
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      r.help = true;
      continue;
    }
    check(a.rfind("--", 0) == 0 && a.size() > 2, "unexpected argument '", a, "'; options start with --");
    std::string value;
    bool has_inline = false;
    if (const size_t eq = a.find('='); eq != std::string::npos) {
      value = a.substr(eq + 1);
      a = a.substr(0, eq);
      has_inline = true;
    }
    const std::string name = name_of(a);
    const Option* o = schema.find(name);
    if (const ForeignFlag* f = o ? nullptr : schema.find_foreign(name)) {
      std::string given;
      if (f->arity == 1) {
        check(has_inline || (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0), a, ": expected a value");
        given = has_inline ? value : std::string(argv[++i]);
      } else {
        check(!has_inline, a, " is a switch and takes no value, got '", value, "'");
      }
      take_foreign(*f, a + (f->arity == 1 ? " " + given : ""), given, "", r, refused);
      continue;
    }
    if (!o) {
      std::vector<std::string> flags;
      for (const auto& n : schema.names()) flags.push_back(flag_of(n).substr(2));
      refused.push_back("unknown option " + a + did_you_mean(a.substr(2), flags, "--") + " (see --help)");
      while (!has_inline && i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) ++i;  // its values
      continue;
    }
    if (name == "config") {
      if (!has_inline) ++i;
      continue;
    }
    const json current = r.values.contains(name) ? r.values[name] : json();
    r.values[name] = flag_value(*o, a, has_inline, value, i, argc, argv, current);
    r.explicit_.insert(name);
  }
  if (!refused.empty()) fail_refused(refused);
  return r;
}

}  // namespace megabatch::config
