// Fuzz target: Megatron .idx/.bin pairs. Input: a little-endian u32 n, then n bytes of
// .idx, then the .bin. Opening and reading every sequence must succeed or throw
// megabatch::Error (naming the file); anything else (a crash, an out-of-bounds read under
// ASan, another exception) is a bug.
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/data/indexed_dataset.h"
#include "core/util/error.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  uint32_t n = 0;
  std::memcpy(&n, data, 4);
  const size_t idx = std::min<size_t>(n, size - 4);
  const auto prefix = megabatch::fuzz::scratch_dir() / "d";
  megabatch::fuzz::write_bytes(prefix.string() + ".idx", data + 4, idx);
  megabatch::fuzz::write_bytes(prefix.string() + ".bin", data + 4 + idx, size - 4 - idx);
  try {
    const megabatch::data::IndexedDataset ds(prefix);
    std::vector<int32_t> out;
    for (size_t s = 0; s < std::min<size_t>(ds.num_sequences(), 256); ++s) out = ds.sequence(s, 50257);
    for (size_t d = 0; d <= std::min<size_t>(ds.num_documents(), 256); ++d) (void)ds.document_index(d);
  } catch (const megabatch::Error&) {
  }
  return 0;
}
