// Fuzz target: sweep files. The input is written as a sweep file and loaded (includes,
// axes, seeds, derived values, validation of every point, at most 1,000 points); it must
// load or throw megabatch::Error naming the file. Every point id must be a safe file name.
#include <string>

#include "core/util/error.h"
#include "sweeps/sweep.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto file = megabatch::fuzz::scratch_dir() / "sweep.json";
  megabatch::fuzz::write_bytes(file, data, size);
  try {
    const auto s = megabatch::sweeps::load_sweep(file, 1000);
    for (const auto& p : s.points)
      if (p.id.empty() || p.id.size() > 120 || p.id.find('/') != std::string::npos || p.id[0] == '.' ||
          p.id.find("..") != std::string::npos)
        throw std::logic_error("unsafe point id '" + p.id + "'");
  } catch (const megabatch::Error&) {
  }
  return 0;
}
