#include "core/data/preprocess.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/data/brown.h"
#include "core/data/compact_vocab.h"
#include "core/data/indexed_dataset.h"
#include "core/data/input_stream.h"
#include "core/data/sentence_splitter.h"
#include "core/data/tokenizer_record.h"
#include "core/util/error.h"
#include "core/util/files.h"
#include "core/util/json.h"
#include "core/util/threads.h"

namespace megabatch::data {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {
// Completes the dataset PREFIX and writes the record of the tokenizer that made it beside it
// (tokenizer_record.h). A record left at PREFIX by an earlier dataset goes first, so that none
// ever describes another dataset's ids.
void finish_dataset(IndexedDatasetBuilder& b, const fs::path& prefix, const TokenizerRecord& record) {
  fs::remove(tokenizer_record_path(prefix));
  b.finalize();
  write_tokenizer_record(prefix, record);
}
}  // namespace

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

namespace {

// --input-format, with auto resolved from the file name; the options checked.
std::string input_format(const PreprocessOptions& o) {
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
  return format;
}

// Up to `batch` records from `in`: jsonl lines (blank ones skipped), or text documents
// separated by blank lines. Returns whether the input has ended.
bool read_records(InputStream& in, bool jsonl, size_t batch, std::vector<RawRecord>& raw, uint64_t& line_no,
                  uint64_t& bytes) {
  raw.clear();
  std::string line;
  bool done = false;
  if (jsonl) {
    while (raw.size() < batch && !(done = !in.getline(line))) {
      ++line_no;
      bytes += line.size() + 1;
      if (is_blank(line)) continue;
      raw.push_back({line_no, std::move(line)});
    }
    return done;
  }
  RawRecord cur;
  while (raw.size() < batch && !(done = !in.getline(line))) {
    ++line_no;
    bytes += line.size() + 1;
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
  return done;
}

// The texts of a jsonl record under --json-keys, or why it has none ("" in `error`).
std::vector<std::string> json_texts(const std::string& record, const std::vector<std::string>& keys, std::string& error) {
  std::vector<std::string> texts(keys.size());
  std::string why;
  auto parsed = parse_json(record, &why, JsonRules{.unique_keys = false});  // as json.loads
  if (!parsed) {
    error = "not valid JSON (" + why + ")";
    return {};
  }
  const nlohmann::json j = std::move(*parsed);
  if (!j.is_object()) {
    error = "expected a JSON object with the key(s) of --json-keys";
    return {};
  }
  for (size_t k = 0; k < keys.size(); ++k) {
    auto it = j.find(keys[k]);
    if (it == j.end()) {
      error = "no key \"" + keys[k] + "\" (set --json-keys to the keys that hold text)";
      return {};
    }
    if (!it->is_string()) {
      error = "key \"" + keys[k] + "\" is " + it->type_name() + ", expected a string";
      return {};
    }
    texts[k] = it->get<std::string>();
  }
  return texts;
}

// A text as the dataset's sequences: the whole document, its lines (text input: one sentence
// per line, BERT's pretraining layout) or its sentences.
std::vector<std::string> sequences(std::string text, const PreprocessOptions& o, bool jsonl) {
  if (!o.split_sentences) return {std::move(text)};
  if (jsonl) return split_sentences(text, o.keep_newlines);
  std::vector<std::string> lines;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    lines.push_back(text.substr(pos, eol - pos) + (o.keep_newlines ? "\n" : ""));
    pos = eol + 1;
  }
  return lines;
}

std::string outputs_line(const PreprocessOptions& o, const std::string& format, const InputStream& in,
                         const Tokenizer& tokenizer, DType dtype) {
  std::string keys;
  for (const auto& key : o.json_keys) keys += (keys.empty() ? "" : ",") + key;
  const std::string compression =
      in.compression() == Compression::kNone ? "" : std::string(", ") + compression_name(in.compression());
  return "preprocess: " + o.input.string() + " (" + format + compression + ") -> " + o.output_prefix.string() + "_{" +
         keys + "}_" + (o.split_sentences ? "sentence" : "document") + " with " + std::string(tokenizer.type()) +
         ", vocab " + std::to_string(tokenizer.vocab_size()) + " (" + dtype_name(dtype) + "), " +
         std::to_string(o.workers) + " worker(s)";
}

}  // namespace

PreprocessStats preprocess(const PreprocessOptions& o, std::ostream& log) {
  const std::string format = input_format(o);
  const bool jsonl = format == "jsonl";
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
  log << outputs_line(o, format, in, *tokenizer, dtype) << std::endl;
  ProgressLog progress(log, o.log_interval);
  const size_t batch = static_cast<size_t>(o.workers) * 512, w = static_cast<size_t>(o.workers);
  std::vector<RawRecord> raw;
  std::vector<std::vector<std::vector<std::string>>> per_key(o.json_keys.size());  // [key][record] sequences
  std::vector<EncodedDocument> encoded;
  uint64_t line_no = 0;
  for (bool ended = false; !ended;) {
    ended = read_records(in, jsonl, batch, raw, line_no, stats.input_bytes);
    if (raw.empty()) break;
    // parse (jsonl) and split into sentences, on the workers
    for (auto& k : per_key) k.assign(raw.size(), {});
    std::vector<std::string> errors(raw.size());
    run_on_threads(w, "preprocess: --workers " + std::to_string(o.workers), [&](size_t t) {
      for (size_t r = t; r < raw.size(); r += w) {
        std::vector<std::string> texts = jsonl ? json_texts(raw[r].text, o.json_keys, errors[r])
                                               : std::vector<std::string>{std::move(raw[r].text)};
        for (size_t k = 0; k < texts.size(); ++k) per_key[k][r] = sequences(std::move(texts[k]), o, jsonl);
      }
    });
    std::vector<bool> keep(raw.size(), true);
    for (size_t r = 0; r < raw.size(); ++r) {
      if (errors[r].empty()) continue;
      const std::string where = o.input.string() + ":" + std::to_string(raw[r].line) + ": " + errors[r];
      if (!o.skip_bad_lines) fail(where, "; fix the line or pass --skip-bad-lines to skip such lines");
      if (stats.bad_lines++ == 0) stats.first_bad_line = where;
      keep[r] = false;
    }
    // encode and write, in input order
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
         "; expected ", jsonl ? "one JSON object per line" : "text with documents separated by blank lines");
  const TokenizerRecord record = describe_tokenizer(*tokenizer, o.tokenizer.vocab_file);
  for (size_t k = 0; k < builders.size(); ++k) finish_dataset(*builders[k], stats.outputs[k], record);
  stats.seconds = progress.seconds();
  progress.update(stats.documents, stats.input_bytes, true);
  if (stats.bad_lines)
    log << "Skipped " << stats.bad_lines << " bad line(s); the first: " << stats.first_bad_line << std::endl;
  for (const auto& p : stats.outputs) log << "wrote " << p.string() << ".bin/.idx/.tokenizer.json" << std::endl;
  return stats;
}

// ---------------------------------------------------------------- default dataset

namespace {

// The default dataset's three files (GPT-2 documents, BERT sentences, the compact GPT-2
// dataset with its own vocabulary).
struct BrownFiles {
  fs::path gpt, bert, compact;
};

void write_compact(const BrownFiles& f, std::ostream& log) {
  TokenizerOptions to;
  const auto v = compact_dataset(f.gpt, f.compact, *make_tokenizer(to));
  log << "wrote " << f.compact.string() << ".bin/.idx/.vocab.json: the " << v.ids.size()
      << " GPT-2 tokens the corpus uses" << std::endl;
}

// Whether `dir` holds the dataset already, intact (a compact dataset from an older version,
// or damaged, is made again from the GPT-2 dataset; the tokenizer records an older version did
// not write are written); says so.
bool brown_up_to_date(const fs::path& dir, const BrownFiles& f, std::ostream& log) {
  try {
    IndexedDataset a(f.gpt), b(f.bert);
    if (!fs::exists(dir / "brown.jsonl")) return false;
    for (const auto& [prefix, type] :
         {std::pair{f.gpt, "GPT2BPETokenizer"}, std::pair{f.bert, "BertWordPieceLowerCase"}}) {
      TokenizerOptions to;
      to.type = type;
      const auto tok = make_tokenizer(to);
      if (fs::exists(tokenizer_record_path(prefix)))
        check_tokenizer_record(prefix, *tok);  // another tokenizer's: rebuild
      else
        write_tokenizer_record(prefix, describe_tokenizer(*tok));
    }
    bool compact_ok = false;
    try {
      const IndexedDataset c(f.compact);
      compact_ok = c.num_tokens() == a.num_tokens() && c.num_documents() == a.num_documents() &&
                   read_compact_vocab(compact_vocab_path(f.compact)).tokenizer_type == "GPT2BPETokenizer";
    } catch (const Error&) {
    }
    if (!compact_ok) write_compact(f, log);
    log << "default dataset is up to date in " << dir.string() << " (" << a.num_documents() << " documents, "
        << a.num_tokens() << " GPT-2 tokens; " << b.num_sequences() << " sentences, " << b.num_tokens()
        << " WordPiece tokens); pass --force to rebuild" << std::endl;
    return true;
  } catch (const Error&) {
    return false;  // missing or damaged: rebuild
  }
}

// Writes the documents of `tokenizer_type` to `prefix` (.bin/.idx).
void build_dataset(const fs::path& prefix, const std::string& tokenizer_type,
                   const std::vector<std::vector<std::string>>& input, bool eod, int workers, std::ostream& log) {
  TokenizerOptions to;
  to.type = tokenizer_type;
  const auto tok = make_tokenizer(to);
  std::vector<EncodedDocument> enc;
  encode_documents(*tok, input, eod, workers, enc);
  IndexedDatasetBuilder b(prefix, token_dtype(tok->vocab_size()));
  uint64_t tokens = 0;
  for (const auto& e : enc) {
    b.add_document(e.tokens, e.lengths);
    tokens += e.tokens.size();
  }
  finish_dataset(b, prefix, describe_tokenizer(*tok));
  log << "wrote " << prefix.string() << ".bin/.idx/.tokenizer.json: " << tokenizer_type << ", " << b.num_sequences()
      << " sequences, " << tokens << " tokens" << std::endl;
}

}  // namespace

void build_brown(const fs::path& dir, int workers, bool force, std::ostream& log) {
  const BrownFiles f{dir / "brown_gpt2_text_document", dir / "brown_bert_text_sentence",
                     dir / "brown_gpt2_compact_text_document"};
  if (!force && brown_up_to_date(dir, f, log)) return;
  fs::create_directories(dir);
  const auto t0 = Clock::now();
  const auto docs = read_brown(asset_path("brown"));
  uint64_t bytes = 0, sentences = 0;
  std::vector<std::vector<std::string>> texts, sentence_lists;  // per document: {text}, its sentences
  texts.reserve(docs.size());
  sentence_lists.reserve(docs.size());
  AtomicFile jsonl(dir / "brown.jsonl");
  for (const auto& d : docs) {
    std::string text;
    for (const auto& s : d.sentences) text += (text.empty() ? "" : " ") + s;
    bytes += text.size();
    sentences += d.sentences.size();
    const std::string line = nlohmann::json{{"id", d.id}, {"category", d.category}, {"text", text}}.dump() + "\n";
    texts.push_back({std::move(text)});
    sentence_lists.push_back(d.sentences);
    jsonl.write(line.data(), line.size());
  }
  jsonl.commit();
  log << "Brown corpus: " << docs.size() << " documents, " << sentences << " sentences, " << bytes
      << " bytes of de-tagged text -> " << (dir / "brown.jsonl").string() << std::endl;
  build_dataset(f.gpt, "GPT2BPETokenizer", texts, true, workers, log);
  build_dataset(f.bert, "BertWordPieceLowerCase", sentence_lists, false, workers, log);
  write_compact(f, log);
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
    if (const int32_t eod = tokenizer->special().eod; eod >= 0) {  // made with --append-eod: every one
      size_t ending = 0;
      for (size_t d = 0; d < ds.num_documents(); ++d) ending += ds.last_token(d) == eod;
      out << "end of doc   " << ending << " of " << ds.num_documents() << " documents end in "
          << tokenizer->token_text(eod) << " (" << eod << ")\n";
    }
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
