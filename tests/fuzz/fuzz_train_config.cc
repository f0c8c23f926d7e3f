// Fuzz target: train's configuration. The input is tried as a JSON config file's content
// and, split at whitespace, as command-line flags; both must resolve or throw
// megabatch::Error naming the key or flag. Anything else is a bug.
#include <nlohmann/json.hpp>

#include <sstream>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/train/train_schema.h"
#include "core/util/error.h"
#include "core/util/json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace megabatch;
  const std::string text(reinterpret_cast<const char*>(data), size);
  const auto& schema = train::train_schema();
  try {  // as train reads --config: refused text is the caller's error
    if (const auto j = parse_json(text)) (void)config::resolve_json(schema, *j, "fuzz.json").values.dump();
  } catch (const Error&) {
  }
  std::istringstream words(text);
  std::vector<std::string> args{"train"};
  for (std::string w; words >> w;) args.push_back(w);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  try {
    const auto r = config::resolve(schema, static_cast<int>(argv.size()), argv.data(), 1);
    (void)r.values.dump();  // what train writes to config.json
  } catch (const Error&) {
  }
  return 0;
}
