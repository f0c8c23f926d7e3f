#include "core/data/preprocess.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <chrono>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/data/brown.h"
#include "core/data/compact_vocab.h"
#include "core/data/indexed_dataset.h"
#include "core/data/input_stream.h"
#include "core/data/sentence_splitter.h"
#include "core/util/error.h"
#include "core/util/files.h"
#include "core/util/json.h"
#include "core/util/threads.h"

namespace megabatch::data {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

fs::path output_name(const fs::path& prefix, const std::string& key, bool sentences) {
  fs::path p = prefix;
  p += "_" + key + (sentences ? "_sentence" : "_document");
  return p;
}

void encode_documents(const Tokenizer& tokenizer, const std::vector<std::vector<std::string>>& docs,
                      bool append_eod, int workers, std::vector<EncodedDocument>& out) {
  out.assign(docs.size(), EncodedDocument{});
  const int32_t eod = tokenizer.special().eod;
  auto work = [&](size_t begin, size_t end) {
    std::vector<int32_t> ids;
    for (size_t d = begin; d < end; ++d) {
      EncodedDocument& e = out[d];
      for (const auto& sentence : docs[d]) {
        ids.clear();
        tokenizer.encode(sentence, ids);
        if (ids.empty()) continue;
        e.tokens.insert(e.tokens.end(), ids.begin(), ids.end());
        e.lengths.push_back(static_cast<int32_t>(ids.size()));
      }
      if (append_eod && !e.lengths.empty()) {
        e.tokens.push_back(eod);
        ++e.lengths.back();
      }
    }
  };
  const size_t n = docs.size();
  const auto w = static_cast<size_t>(std::max(1, workers));
  if (w == 1 || n < 2) {
    work(0, n);
    return;
  }
  // Interleaved chunks keep the threads busy when document sizes vary.
  const size_t chunk = std::max<size_t>(1, n / (w * 8));
  std::atomic<size_t> next{0};
  run_on_threads(w, "preprocess: --workers " + std::to_string(workers), [&](size_t) {
    for (size_t b; (b = next.fetch_add(chunk)) < n;) work(b, std::min(n, b + chunk));
  });
}

namespace {

struct RawRecord {
  uint64_t line = 0;  // first line of the record in the input file
  std::string text;   // a jsonl line, or a text document
};

bool is_blank(const std::string& s) { return s.find_first_not_of(" \t\r") == std::string::npos; }

class ProgressLog {
 public:
  ProgressLog(std::ostream& log, int64_t interval) : log_(log), interval_(interval), start_(Clock::now()) {}
  void update(uint64_t docs, uint64_t bytes, bool final = false) {
    if (!final && (interval_ <= 0 || docs < next_)) return;
    while (interval_ > 0 && next_ <= docs) next_ += static_cast<uint64_t>(interval_);
    const double s = std::max(1e-9, std::chrono::duration<double>(Clock::now() - start_).count());
    log_ << (final ? "Done: " : "") << "Processed " << docs << " documents (" << std::fixed << std::setprecision(1)
         << static_cast<double>(docs) / s << " docs/s, " << std::setprecision(2)
         << static_cast<double>(bytes) / s / 1e6 << " MB/s)." << std::defaultfloat << std::endl;
  }
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

 private:
  std::ostream& log_;
  int64_t interval_;
  uint64_t next_ = 0;
  Clock::time_point start_;
};

}  // namespace

PreprocessStats preprocess(const PreprocessOptions& o, std::ostream& log) {
  if (o.input.empty()) fail("preprocess: --input is required");
  if (o.output_prefix.empty()) fail("preprocess: --output-prefix is required");
  if (o.json_keys.empty()) fail("preprocess: --json-keys needs at least one key");
  if (o.workers < 1) fail("preprocess: --workers must be at least 1, got ", o.workers);
  std::string format = o.input_format;
  if (format == "auto") {
    const std::string ext = strip_compression_extension(o.input).extension().string();  // wiki.jsonl.xz: jsonl
    format = (ext == ".jsonl" || ext == ".json" || ext == ".ndjson") ? "jsonl" : "text";
  }
  if (format != "jsonl" && format != "text")
    fail("preprocess: --input-format must be auto, jsonl or text, got '", o.input_format, "'");
  if (format == "text" && (o.json_keys.size() != 1 || o.json_keys[0] != "text"))
    fail("preprocess: --json-keys applies to jsonl input; plain text input has the single key 'text'");
  InputStream in(o.input);  // plain, gzip, xz or zstd
  if (!o.output_prefix.parent_path().empty() && !fs::exists(o.output_prefix.parent_path()))
    fail(o.output_prefix.parent_path().string(), ": the output directory does not exist; create it first");

  const auto tokenizer = make_tokenizer(o.tokenizer);
  if (o.append_eod && tokenizer->special().eod < 0)
    fail("preprocess: --append-eod: tokenizer ", tokenizer->type(), " has no end-of-document token");
  const DType dtype = token_dtype(tokenizer->vocab_size());
  std::vector<std::unique_ptr<IndexedDatasetBuilder>> builders;
  PreprocessStats stats;
  for (const auto& key : o.json_keys) {
    stats.outputs.push_back(output_name(o.output_prefix, key, o.split_sentences));
    builders.push_back(std::make_unique<IndexedDatasetBuilder>(stats.outputs.back(), dtype));
  }
  log << "preprocess: " << o.input.string() << " (" << format << (in.compression() == Compression::kNone ? "" : std::string(", ") + compression_name(in.compression())) << ") -> " << o.output_prefix.string() << "_{"
      << [&] {
           std::string k;
           for (const auto& key : o.json_keys) k += (k.empty() ? "" : ",") + key;
           return k;
         }()
      << "}_" << (o.split_sentences ? "sentence" : "document") << " with " << tokenizer->type() << ", vocab "
      << tokenizer->vocab_size() << " (" << dtype_name(dtype) << "), " << o.workers << " worker(s)" << std::endl;

  ProgressLog progress(log, o.log_interval);
  const size_t batch = static_cast<size_t>(o.workers) * 512;
  std::vector<RawRecord> raw;
  std::vector<std::vector<std::vector<std::string>>> per_key(o.json_keys.size());
  std::vector<EncodedDocument> encoded;
  std::string line;
  uint64_t line_no = 0;
  bool eof = false, input_done = false;
  while (!eof) {
    // ---- read a batch of records
    raw.clear();
    if (format == "jsonl") {
      while (raw.size() < batch && !(input_done = !in.getline(line))) {
        ++line_no;
        stats.input_bytes += line.size() + 1;
        if (is_blank(line)) continue;
        raw.push_back({line_no, std::move(line)});
      }
    } else {  // text: documents separated by blank lines
      RawRecord cur;
      while (raw.size() < batch && !(input_done = !in.getline(line))) {
        ++line_no;
        stats.input_bytes += line.size() + 1;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (is_blank(line)) {
          if (!cur.text.empty()) raw.push_back(std::move(cur));
          cur = RawRecord{};
          continue;
        }
        if (cur.text.empty()) cur.line = line_no;
        else cur.text.push_back('\n');
        cur.text += line;
      }
      if (!cur.text.empty()) raw.push_back(std::move(cur));
    }
    eof = raw.empty() || input_done;
    if (raw.empty()) break;

    // ---- parse (jsonl) and split into sentences
    for (auto& k : per_key) k.assign(raw.size(), {});
    std::vector<std::string> errors(raw.size());
    auto parse = [&](size_t r) {
      std::vector<std::string> texts(o.json_keys.size());
      if (format == "jsonl") {
        std::string why;
        auto parsed = parse_json(raw[r].text, &why, JsonRules{.unique_keys = false});  // as json.loads
        if (!parsed) {
          errors[r] = "not valid JSON (" + why + ")";
          return;
        }
        const nlohmann::json j = std::move(*parsed);
        if (!j.is_object()) {
          errors[r] = "expected a JSON object with the key(s) of --json-keys";
          return;
        }
        for (size_t k = 0; k < o.json_keys.size(); ++k) {
          auto it = j.find(o.json_keys[k]);
          if (it == j.end()) {
            errors[r] = "no key \"" + o.json_keys[k] + "\" (set --json-keys to the keys that hold text)";
            return;
          }
          if (!it->is_string()) {
            errors[r] = "key \"" + o.json_keys[k] + "\" is " + it->type_name() + ", expected a string";
            return;
          }
          texts[k] = it->get<std::string>();
        }
      } else {
        texts[0] = std::move(raw[r].text);
      }
      for (size_t k = 0; k < texts.size(); ++k) {
        if (!o.split_sentences) {
          per_key[k][r] = {std::move(texts[k])};
        } else if (format == "text") {  // one sentence per line (BERT's pretraining layout)
          std::vector<std::string> lines;
          size_t pos = 0;
          while (pos <= texts[k].size()) {
            size_t eol = texts[k].find('\n', pos);
            if (eol == std::string::npos) eol = texts[k].size();
            lines.push_back(texts[k].substr(pos, eol - pos) + (o.keep_newlines ? "\n" : ""));
            pos = eol + 1;
          }
          per_key[k][r] = std::move(lines);
        } else {
          per_key[k][r] = split_sentences(texts[k], o.keep_newlines);
        }
      }
    };
    const size_t w = static_cast<size_t>(o.workers);
    run_on_threads(w, "preprocess: --workers " + std::to_string(o.workers), [&](size_t t) {
      for (size_t r = t; r < raw.size(); r += w) parse(r);
    });
    std::vector<bool> keep(raw.size(), true);
    for (size_t r = 0; r < raw.size(); ++r) {
      if (errors[r].empty()) continue;
      const std::string where = o.input.string() + ":" + std::to_string(raw[r].line) + ": " + errors[r];
      if (!o.skip_bad_lines) fail(where, "; fix the line or pass --skip-bad-lines to skip such lines");
      if (stats.bad_lines++ == 0) stats.first_bad_line = where;
      keep[r] = false;
    }
    // ---- encode and write, in input order
    for (size_t k = 0; k < o.json_keys.size(); ++k) {
      encode_documents(*tokenizer, per_key[k], o.append_eod, o.workers, encoded);
      for (size_t r = 0; r < raw.size(); ++r) {
        if (!keep[r]) continue;
        builders[k]->add_document(encoded[r].tokens, encoded[r].lengths);
        stats.tokens += encoded[r].tokens.size();
        stats.sentences += encoded[r].lengths.size();
      }
    }
    for (size_t r = 0; r < raw.size(); ++r) stats.documents += keep[r];
    progress.update(stats.documents, stats.input_bytes);
  }
  if (stats.documents == 0)
    fail(o.input.string(), ": no documents found", stats.bad_lines ? " (every line was bad)" : "",
         "; expected ", format == "jsonl" ? "one JSON object per line" : "text with documents separated by blank lines");
  for (auto& b : builders) b->finalize();
  stats.seconds = progress.seconds();
  progress.update(stats.documents, stats.input_bytes, true);
  if (stats.bad_lines)
    log << "Skipped " << stats.bad_lines << " bad line(s); the first: " << stats.first_bad_line << std::endl;
  for (const auto& p : stats.outputs) log << "wrote " << p.string() << ".bin/.idx" << std::endl;
  return stats;
}

// ---------------------------------------------------------------- default dataset

void build_brown(const fs::path& dir, int workers, bool force, std::ostream& log) {
  const fs::path gpt = dir / "brown_gpt2_text_document", bert = dir / "brown_bert_text_sentence",
                 compact = dir / "brown_gpt2_compact_text_document";
  auto write_compact = [&] {
    TokenizerOptions to;
    const auto v = compact_dataset(gpt, compact, *make_tokenizer(to));
    log << "wrote " << compact.string() << ".bin/.idx/.vocab.json: the " << v.ids.size()
        << " GPT-2 tokens the corpus uses" << std::endl;
  };
  if (!force) {
    try {
      IndexedDataset a(gpt), b(bert);
      if (fs::exists(dir / "brown.jsonl")) {
        bool compact_ok = false;  // made by an older version, or damaged: made again from the GPT-2 dataset
        try {
          const IndexedDataset c(compact);
          compact_ok = c.num_tokens() == a.num_tokens() && c.num_documents() == a.num_documents() &&
                       read_compact_vocab(compact_vocab_path(compact)).tokenizer_type == "GPT2BPETokenizer";
        } catch (const Error&) {
        }
        if (!compact_ok) write_compact();
        log << "default dataset is up to date in " << dir.string() << " (" << a.num_documents() << " documents, "
            << a.num_tokens() << " GPT-2 tokens; " << b.num_sequences() << " sentences, " << b.num_tokens()
            << " WordPiece tokens); pass --force to rebuild" << std::endl;
        return;
      }
    } catch (const Error&) {
      // missing or damaged: rebuild
    }
  }
  fs::create_directories(dir);
  const auto t0 = Clock::now();
  const auto docs = read_brown(asset_path("brown"));
  uint64_t bytes = 0, sentences = 0;
  std::vector<std::vector<std::string>> texts, sentence_lists;  // per document: {text}, its sentences
  texts.reserve(docs.size());
  sentence_lists.reserve(docs.size());
  {
    AtomicFile jsonl(dir / "brown.jsonl");
    for (const auto& d : docs) {
      std::string text;
      for (const auto& s : d.sentences) text += (text.empty() ? "" : " ") + s;
      bytes += text.size();
      sentences += d.sentences.size();
      const std::string line =
          nlohmann::json{{"id", d.id}, {"category", d.category}, {"text", text}}.dump() + "\n";
      texts.push_back({std::move(text)});
      sentence_lists.push_back(d.sentences);
      jsonl.write(line.data(), line.size());
    }
    jsonl.commit();
  }
  log << "Brown corpus: " << docs.size() << " documents, " << sentences << " sentences, " << bytes
      << " bytes of de-tagged text -> " << (dir / "brown.jsonl").string() << std::endl;

  auto build = [&](const fs::path& prefix, const std::string& type,
                   const std::vector<std::vector<std::string>>& input, bool eod) {
    TokenizerOptions to;
    to.type = type;
    const auto tok = make_tokenizer(to);
    std::vector<EncodedDocument> enc;
    encode_documents(*tok, input, eod, workers, enc);
    IndexedDatasetBuilder b(prefix, token_dtype(tok->vocab_size()));
    uint64_t tokens = 0;
    for (const auto& e : enc) {
      b.add_document(e.tokens, e.lengths);
      tokens += e.tokens.size();
    }
    b.finalize();
    log << "wrote " << prefix.string() << ".bin/.idx: " << type << ", " << b.num_sequences() << " sequences, "
        << tokens << " tokens" << std::endl;
  };
  build(gpt, "GPT2BPETokenizer", texts, true);
  build(bert, "BertWordPieceLowerCase", sentence_lists, false);
  write_compact();
  log << "default dataset ready in " << dir.string() << " ("
      << std::chrono::duration<double>(Clock::now() - t0).count() << " s)" << std::endl;
}

// ---------------------------------------------------------------- inspect

void inspect(const fs::path& prefix, int documents, const Tokenizer* tokenizer, std::ostream& out) {
  const IndexedDataset ds(prefix);
  int64_t max_id = -1, min_id = std::numeric_limits<int64_t>::max();
  std::vector<int32_t> buf;
  for (size_t i = 0; i < ds.num_sequences(); ++i) {
    buf.resize(static_cast<size_t>(ds.sequence_length(i)));
    ds.read(i, 0, buf.size(), buf.data());
    for (const int32_t t : buf) {
      max_id = std::max<int64_t>(max_id, t);
      min_id = std::min<int64_t>(min_id, t);
    }
  }
  out << "dataset      " << prefix.string() << "\n"
      << "dtype        " << dtype_name(ds.dtype()) << "\n"
      << "documents    " << ds.num_documents() << "\n"
      << "sequences    " << ds.num_sequences() << "\n"
      << "tokens       " << ds.num_tokens() << "\n"
      << "token ids    " << (ds.num_tokens() ? min_id : 0) << " .. " << max_id << "\n";
  if (tokenizer != nullptr) {
    out << "tokenizer    " << tokenizer->type() << " (vocab " << tokenizer->vocab_size() << ")\n";
    if (max_id >= tokenizer->vocab_size())
      fail(prefix.string(), ": token id ", max_id, " is outside the vocabulary of ", tokenizer->type(), " (",
           tokenizer->vocab_size(), "); was the dataset built with another tokenizer?");
  }
  for (size_t d = 0; d < std::min<size_t>(static_cast<size_t>(documents), ds.num_documents()); ++d) {
    const auto a = static_cast<size_t>(ds.document_index(d)), b = static_cast<size_t>(ds.document_index(d + 1));
    out << "\n--- document " << d << ": " << (b - a) << " sequence(s)\n";
    for (size_t s = a; s < b; ++s) {
      const auto ids = ds.sequence(s);
      if (tokenizer != nullptr) {
        out << tokenizer->decode(ids) << (b - a > 1 ? "\n" : "");
      } else {
        out << "[";
        for (size_t i = 0; i < ids.size(); ++i) out << (i ? " " : "") << ids[i];
        out << "]\n";
      }
    }
    out << "\n";
  }
}

}  // namespace megabatch::data
