// Fuzz target: JSON-lines corpus input as preprocess reads it: each line parsed as JSON by
// preprocess's parser (a line it refuses is the caller's "bad line"), its "text" split into
// sentences and encoded with GPT-2's BPE and BERT's WordPiece. Only megabatch::Error may come
// out; a crash or any other exception is a bug.
#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <vector>

#include "core/data/gpt2_tokenizer.h"
#include "core/data/sentence_splitter.h"
#include "core/data/wordpiece_tokenizer.h"
#include "core/util/error.h"
#include "core/util/files.h"
#include "core/util/json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace megabatch;
  static const data::Gpt2Tokenizer gpt2(asset_path("gpt2/encoder.json"), asset_path("gpt2/vocab.bpe"));
  static const data::WordPieceTokenizer wordpiece(asset_path("bert/vocab.txt"), true);
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  size_t at = 0;
  while (at <= text.size()) {
    size_t nl = text.find('\n', at);
    if (nl == std::string_view::npos) nl = text.size();
    const std::string_view line = text.substr(at, nl - at);
    at = nl + 1;
    const auto parsed = parse_json(line);
    if (!parsed) continue;
    const nlohmann::json& j = *parsed;
    if (!j.is_object() || !j.contains("text") || !j["text"].is_string()) continue;
    const std::string doc = j["text"].get<std::string>();
    try {
      std::vector<int32_t> ids;
      for (const auto& sentence : data::split_sentences(doc, false)) {
        gpt2.encode(sentence, ids);
        wordpiece.encode(sentence, ids);
      }
      const std::string back = gpt2.decode(gpt2.encode(doc));
      if (back != doc) throw std::logic_error("GPT-2 decode(encode(text)) differs from the text");
    } catch (const Error&) {
    }
  }
  return 0;
}
