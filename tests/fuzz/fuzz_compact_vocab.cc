// Fuzz target: the files that say what a dataset's ids mean, its compact vocabulary
// (PREFIX.vocab.json) and its tokenizer record (PREFIX.tokenizer.json), each given the same
// bytes. Reading the vocabulary and seeing a tokenizer through it must succeed or throw
// megabatch::Error naming the file; on success every compact id decodes and every special
// token is in range. Checking a tokenizer against the record must succeed or throw an Error
// naming the record. Anything else is a bug.
#include <algorithm>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "core/data/compact_vocab.h"
#include "core/data/tokenizer_record.h"
#include "core/util/error.h"
#include "tests/fuzz/fuzz_util.h"

namespace {
// Ids 0..size-1 with the last as the end of document, as GPT-2 has it.
class Numbers final : public megabatch::data::Tokenizer {
 public:
  explicit Numbers(int64_t size) : size_(size) { special_.eod = static_cast<int32_t>(size - 1); }
  std::string_view type() const override { return "GPT2BPETokenizer"; }
  void encode(std::string_view text, std::vector<int32_t>& out) const override {
    for (const char c : text) out.push_back(static_cast<unsigned char>(c) % static_cast<int32_t>(size_));
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::string s;
    for (const int32_t id : ids) {
      if (id < 0 || id >= size_) std::abort();  // the compact layer must never pass such an id
      s += std::to_string(id) + " ";
    }
    return s;
  }
  std::string token_text(int32_t id) const override { return std::to_string(id); }
  int64_t vocab_size() const override { return size_; }

 private:
  int64_t size_;
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace megabatch;
  const auto prefix = fuzz::scratch_dir() / "v";
  fuzz::write_bytes(data::compact_vocab_path(prefix), data, size);
  try {
    const data::CompactVocab v = data::read_compact_vocab(data::compact_vocab_path(prefix));
    if (v.base_vocab_size > (1 << 20)) return 0;  // a real tokenizer that large is not worth building here
    auto tok = data::tokenizer_for_dataset(std::make_unique<Numbers>(v.base_vocab_size), prefix);
    std::vector<int32_t> all(static_cast<size_t>(tok->vocab_size()));
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int32_t>(i);
    (void)tok->decode(all);
    if (tok->special().eod >= tok->vocab_size()) std::abort();
    try {
      (void)tok->encode("fuzz");
    } catch (const Error&) {  // a byte outside the vocabulary: named, not a crash
    }
  } catch (const Error&) {
  }
  const auto recorded = fuzz::scratch_dir() / "r";
  fuzz::write_bytes(data::tokenizer_record_path(recorded), data, size);
  try {
    data::check_tokenizer_record(recorded, Numbers(10));
  } catch (const Error& e) {
    if (std::string(e.what()).find(data::tokenizer_record_path(recorded).string()) == std::string::npos) std::abort();
  }
  return 0;
}
