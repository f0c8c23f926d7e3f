#include "core/data/compact_vocab.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

#include "core/data/indexed_dataset.h"
#include "core/data/tokenizer_record.h"
#include "core/util/error.h"
#include "core/util/files.h"
#include "core/util/json.h"

namespace megabatch::data {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "megabatch compact vocabulary 1";

class CompactTokenizer final : public Tokenizer {
 public:
  CompactTokenizer(std::unique_ptr<Tokenizer> base, CompactVocab vocab, fs::path file)
      : base_(std::move(base)), vocab_(std::move(vocab)), file_(std::move(file)),
        compact_(static_cast<size_t>(base_->vocab_size()), -1) {
    for (size_t i = 0; i < vocab_.ids.size(); ++i) compact_[static_cast<size_t>(vocab_.ids[i])] = static_cast<int32_t>(i);
    // compact_tokenizer() checked that every special token is in the vocabulary; sentinels are
    // consecutive tokenizer ids, so their compact ids are consecutive too.
    special_ = base_->special();
    for (int32_t* id : {&special_.eod, &special_.cls, &special_.sep, &special_.mask, &special_.pad, &special_.unk,
                        &special_.bos, &special_.eos, &special_.first_sentinel})
      *id = to_compact(*id);
  }

  std::string_view type() const override { return base_->type(); }

  void encode(std::string_view text, std::vector<int32_t>& out) const override {
    const size_t start = out.size();
    base_->encode(text, out);
    for (size_t i = start; i < out.size(); ++i) {
      const int32_t c = to_compact(out[i]);
      if (c < 0)
        fail("the text has the token \"", base_->token_text(out[i]), "\" (", base_->type(), " id ", out[i],
             "), which is not in the compact vocabulary ", file_.string(), " (", vocab_.ids.size(),
             " tokens of ", vocab_.source, "); use the full dataset ", vocab_.source, " for such text");
      out[i] = c;
    }
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::vector<int32_t> base_ids(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) base_ids[i] = to_base(ids[i]);
    return base_->decode(base_ids);
  }

  std::string token_text(int32_t id) const override { return base_->token_text(to_base(id)); }
  int64_t vocab_size() const override { return static_cast<int64_t>(vocab_.ids.size()); }

 private:
  int32_t to_compact(int32_t id) const {
    return id >= 0 && static_cast<size_t>(id) < compact_.size() ? compact_[static_cast<size_t>(id)] : -1;
  }
  int32_t to_base(int32_t id) const {
    if (id < 0 || static_cast<size_t>(id) >= vocab_.ids.size())
      fail("token id ", id, " is outside the compact vocabulary [0, ", vocab_.ids.size(), ") of ", file_.string());
    return vocab_.ids[static_cast<size_t>(id)];
  }

  std::unique_ptr<Tokenizer> base_;
  CompactVocab vocab_;
  fs::path file_;
  std::vector<int32_t> compact_;  // tokenizer id -> compact id, -1 where the corpus lacks it
};

}  // namespace

fs::path compact_vocab_path(const fs::path& prefix) { return fs::path(prefix.string() + ".vocab.json"); }

CompactVocab read_compact_vocab(const fs::path& file) {
  const std::string where = file.string();
  const nlohmann::json j =
      parse_json_or_fail(read_file(file, "compact vocabulary"), where, "; rebuild it with `preprocess compact`");
  auto need = [&](const char* key, bool ok, const char* what) {
    if (!j.is_object() || !j.contains(key)) fail(where, ": no \"", key, "\"; rebuild it with `preprocess compact`");
    if (!ok) fail(where, ": \"", key, "\" must be ", what, "; rebuild it with `preprocess compact`");
  };
  need("format", j.is_object() && j.contains("format") && j["format"] == kFormat, "\"megabatch compact vocabulary 1\"");
  need("tokenizer_type", j.contains("tokenizer_type") && j["tokenizer_type"].is_string(), "a string");
  need("base_vocab_size", j.contains("base_vocab_size") && j["base_vocab_size"].is_number_integer() &&
                              j["base_vocab_size"].get<int64_t>() > 0 &&
                              j["base_vocab_size"].get<int64_t>() <= std::numeric_limits<int32_t>::max(),
       "a positive integer below 2^31");
  need("ids", j.contains("ids") && j["ids"].is_array() && !j["ids"].empty(), "a non-empty array of token ids");
  CompactVocab v;
  v.tokenizer_type = j["tokenizer_type"].get<std::string>();
  v.base_vocab_size = j["base_vocab_size"].get<int64_t>();
  v.source = j.value("source", std::string("?"));
  v.ids.reserve(j["ids"].size());
  for (size_t i = 0; i < j["ids"].size(); ++i) {
    const auto& x = j["ids"][i];
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= v.base_vocab_size)
      fail(where, ": \"ids\"[", i, "] is ", x.dump(), ", expected a token id in [0, ", v.base_vocab_size, ")");
    v.ids.push_back(x.get<int32_t>());
    if (i > 0 && v.ids[i] <= v.ids[i - 1])
      fail(where, ": \"ids\" must ascend without repeats, but [", i, "] = ", v.ids[i], " follows ", v.ids[i - 1]);
  }
  return v;
}

CompactVocab compact_dataset(const fs::path& in, const fs::path& out, const Tokenizer& tokenizer) {
  const int64_t base_vocab_size = tokenizer.vocab_size();
  if (fs::absolute(in).lexically_normal() == fs::absolute(out).lexically_normal())
    fail("preprocess compact: the output ", out.string(), " would overwrite its input; give another prefix");
  if (fs::exists(compact_vocab_path(in)))
    fail(in.string(), " is already compact (", compact_vocab_path(in).string(), " exists)");
  check_tokenizer_record(in, tokenizer);
  const IndexedDataset ds(in);
  std::vector<char> used(static_cast<size_t>(base_vocab_size), 0);
  std::vector<int32_t> buf;
  for (size_t s = 0; s < ds.num_sequences(); ++s) {
    buf.resize(static_cast<size_t>(ds.sequence_length(s)));
    ds.read(s, 0, buf.size(), buf.data(), base_vocab_size);  // names the token outside the vocabulary
    for (const int32_t t : buf) used[static_cast<size_t>(t)] = 1;
  }
  const SpecialTokens& sp = tokenizer.special();
  for (const int32_t id : {sp.eod, sp.cls, sp.sep, sp.mask, sp.pad, sp.unk, sp.bos, sp.eos})
    if (id >= 0 && id < base_vocab_size) used[static_cast<size_t>(id)] = 1;
  for (int i = 0; i < sp.num_sentinels; ++i) used[static_cast<size_t>(sp.sentinel(i))] = 1;
  CompactVocab v;
  v.tokenizer_type = std::string(tokenizer.type());
  v.base_vocab_size = base_vocab_size;
  v.source = in.string();
  std::vector<int32_t> compact(used.size(), -1);
  for (size_t id = 0; id < used.size(); ++id)
    if (used[id]) {
      compact[id] = static_cast<int32_t>(v.ids.size());
      v.ids.push_back(static_cast<int32_t>(id));
    }
  if (ds.num_tokens() == 0) fail(in.string(), ": the dataset has no tokens; there is nothing to compact");

  // The vocabulary first, and any old OUT.idx gone before it: a crash before the new .idx
  // leaves no dataset to train on, never ids without the file that says what they mean. (The
  // vocabulary names the tokenizer: a tokenizer record at OUT is an earlier dataset's.)
  fs::remove(fs::path(out.string() + ".idx"));
  fs::remove(tokenizer_record_path(out));
  write_file_atomic(compact_vocab_path(out),
                    nlohmann::json{{"format", kFormat}, {"tokenizer_type", v.tokenizer_type},
                                   {"base_vocab_size", v.base_vocab_size}, {"source", v.source}, {"ids", v.ids}}
                            .dump() + "\n");
  IndexedDatasetBuilder b(out, token_dtype(static_cast<int64_t>(v.ids.size())));
  for (size_t d = 0; d < ds.num_documents(); ++d) {
    for (int64_t s = ds.document_index(d); s < ds.document_index(d + 1); ++s) {
      buf.resize(static_cast<size_t>(ds.sequence_length(static_cast<size_t>(s))));
      ds.read(static_cast<size_t>(s), 0, buf.size(), buf.data());
      for (int32_t& t : buf) t = compact[static_cast<size_t>(t)];
      b.add_sequence(buf);
    }
    b.end_document();
  }
  b.finalize();
  return v;
}

std::unique_ptr<Tokenizer> compact_tokenizer(std::unique_ptr<Tokenizer> base, CompactVocab vocab, const fs::path& file) {
  if (vocab.tokenizer_type != base->type())
    fail(file.string(), ": the dataset was compacted from ", vocab.tokenizer_type, " ids, but the tokenizer is ",
         base->type(), "; set tokenizer_type to ", vocab.tokenizer_type);
  if (vocab.base_vocab_size != base->vocab_size())
    fail(file.string(), ": the dataset was compacted from a vocabulary of ", vocab.base_vocab_size,
         " tokens, but this ", base->type(), " tokenizer has ", base->vocab_size(),
         "; use the vocab_file (and vocab_extra_ids) it was made with");
  const SpecialTokens& sp = base->special();
  std::vector<int32_t> specials{sp.eod, sp.cls, sp.sep, sp.mask, sp.pad, sp.unk, sp.bos, sp.eos};
  for (int i = 0; i < sp.num_sentinels; ++i) specials.push_back(sp.sentinel(i));
  for (const int32_t id : specials)
    if (id >= 0 && !std::binary_search(vocab.ids.begin(), vocab.ids.end(), id))
      fail(file.string(), ": the special token \"", base->token_text(id), "\" (", base->type(), " id ", id,
           ") is not in the vocabulary, and the sample builders need it; rebuild it with `preprocess compact`");
  return std::make_unique<CompactTokenizer>(std::move(base), std::move(vocab), file);
}

std::unique_ptr<Tokenizer> tokenizer_for_dataset(std::unique_ptr<Tokenizer> base, const fs::path& prefix,
                                                 std::ostream* log) {
  const fs::path file = compact_vocab_path(prefix);
  if (!fs::exists(file)) {
    check_tokenizer_record(prefix, *base);
    return base;
  }
  CompactVocab v = read_compact_vocab(file);
  const int64_t full = base->vocab_size();
  auto t = compact_tokenizer(std::move(base), std::move(v), file);
  if (log)
    *log << "> vocabulary: the " << t->vocab_size() << " " << t->type() << " tokens of " << file.string() << " (of "
         << full << ")\n";
  return t;
}

}  // namespace megabatch::data
