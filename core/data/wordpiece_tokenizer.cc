#include "core/data/wordpiece_tokenizer.h"

#include <vector>

#include "core/data/unicode.h"
#include "core/util/error.h"
#include "core/util/files.h"

namespace megabatch::data {

namespace {

bool is_bert_whitespace(char32_t c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || unicode::is_space_sep(c);
}
bool is_bert_control(char32_t c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  return unicode::is_control(c);
}
bool is_bert_punct(char32_t c) {
  // Every non-alphanumeric printable ASCII character counts, as in BERT, plus category P*.
  if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126))
    return true;
  return c >= 128 && unicode::is_punct(c);
}
bool is_cjk(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// A character _clean_text drops, or one that ends a whitespace token (whitespace, and CJK
// ideographs, which _tokenize_chinese_chars surrounds with spaces).
bool dropped(char32_t c) {
  return c == unicode::kInvalid || c == 0 || c == 0xFFFD || (unicode::assigned_in_bert_reference(c) && is_bert_control(c));
}
bool ends_token(char32_t c) {
  return (unicode::assigned_in_bert_reference(c) && (is_bert_whitespace(c) || c == 0x2028 || c == 0x2029)) || is_cjk(c);
}

// Unicode's Cased and Case_Ignorable, as far as Python's str.lower() needs them to place a
// final sigma: uppercase letters are the ones lowering changes; the lowercase letters of
// the cased scripts (Latin, Greek, Cyrillic, Armenian) are listed; case-ignorable are the
// nonspacing marks and the apostrophes, periods, colons and middle dots between letters.
bool is_cased(char32_t c) {
  char32_t l[3];
  if (unicode::to_lower(c, l) != 1 || l[0] != c) return true;
  return (c >= 'a' && c <= 'z') || c == 0xAA || c == 0xB5 || c == 0xBA || (c >= 0xDF && c <= 0xFF && c != 0xF7) ||
         (c >= 0x100 && c <= 0x24F) || (c >= 0x250 && c <= 0x2AF) || (c >= 0x3AC && c <= 0x3CE) ||
         (c >= 0x3D0 && c <= 0x3FF) || (c >= 0x430 && c <= 0x45F) || (c >= 0x460 && c <= 0x52F) ||
         (c >= 0x561 && c <= 0x587) || (c >= 0x1E00 && c <= 0x1FFF);
}
bool is_case_ignorable(char32_t c) {
  return unicode::is_nonspacing_mark(c) || c == '\'' || c == '.' || c == ':' || c == '^' || c == '`' || c == 0xA8 ||
         c == 0xAD || c == 0xAF || c == 0xB4 || c == 0xB7 || c == 0xB8 || c == 0x387 || c == 0x2018 || c == 0x2019 ||
         c == 0x2024 || c == 0x2027 || (c >= 0x2B0 && c <= 0x36F);
}

// Python's lower() of U+03A3 at byte i of text (the token runs from `begin`): final sigma
// when a cased letter precedes it (case-ignorables skipped) and none follows.
char32_t lower_sigma(std::string_view text, size_t begin, size_t i, size_t len) {
  std::vector<char32_t> before;
  for (size_t k = begin, n = 0; k < i; k += n) {
    const char32_t c = unicode::decode_utf8(text, k, n);
    if (!dropped(c)) before.push_back(c);
  }
  size_t b = before.size();
  while (b > 0 && is_case_ignorable(before[b - 1])) --b;
  if (b == 0 || !is_cased(before[b - 1])) return 0x3C3;
  for (size_t k = i + len, n = 0; k < text.size(); k += n) {
    const char32_t c = unicode::decode_utf8(text, k, n);
    if (dropped(c)) continue;
    if (ends_token(c)) break;
    if (!is_case_ignorable(c)) return is_cased(c) ? 0x3C3 : 0x3C2;
  }
  return 0x3C2;
}

}  // namespace

WordPieceTokenizer::WordPieceTokenizer(const std::filesystem::path& vocab_txt, bool lower_case,
                                       int extra_ids)
    : lower_case_(lower_case) {
  const std::string text = read_file(vocab_txt, "WordPiece vocabulary (vocab.txt)");
  for_each_line(text, [&](std::string_view tok, size_t line) {
    // BERT's loader strips surrounding whitespace of each line.
    while (!tok.empty() && (tok.back() == ' ' || tok.back() == '\t')) tok.remove_suffix(1);
    while (!tok.empty() && (tok.front() == ' ' || tok.front() == '\t')) tok.remove_prefix(1);
    if (tok.empty())
      fail(vocab_txt.string(), ":", line, ": empty token; vocab.txt holds one token per line (line n is id n-1)");
    for (size_t i = 0, len = 0; i < tok.size(); i += len)
      if (unicode::decode_utf8(tok, i, len) == unicode::kInvalid)
        fail(vocab_txt.string(), ":", line, ": token is not valid UTF-8");
    if (!ids_.emplace(std::string(tok), static_cast<int32_t>(tokens_.size())).second)
      fail(vocab_txt.string(), ":", line, ": token \"", tok, "\" appears twice (first at line ",
           ids_.find(tok)->second + 1, ")");
    tokens_.emplace_back(tok);
  });
  if (tokens_.empty()) fail(vocab_txt.string(), ": empty vocabulary; expected one token per line");
  special_.unk = require(vocab_txt, "[UNK]");
  special_.cls = require(vocab_txt, "[CLS]");
  special_.sep = require(vocab_txt, "[SEP]");
  special_.mask = require(vocab_txt, "[MASK]");
  special_.pad = require(vocab_txt, "[PAD]");
  // Megatron's BERT tokenizer appends [BOS], [EOS], then the sentinels.
  auto add = [&](const std::string& tok) {
    auto it = ids_.find(tok);
    if (it != ids_.end()) return it->second;
    const auto id = static_cast<int32_t>(tokens_.size());
    ids_.emplace(tok, id);
    tokens_.push_back(tok);
    return id;
  };
  special_.bos = add("[BOS]");
  special_.eos = add("[EOS]");
  // Megatron's BERT tokenizer has no end-of-document id of its own; --append-eod appends
  // what its tokenizer base falls back to, the end-of-sentence id: [EOS], added above.
  special_.eod = special_.eos;
  if (extra_ids < 0) fail("extra_ids must be >= 0, got ", extra_ids);
  if (extra_ids > 0) {
    special_.num_sentinels = extra_ids;
    special_.first_sentinel = static_cast<int32_t>(tokens_.size());
    for (int i = 0; i < extra_ids; ++i)
      if (add("<extra_id_" + std::to_string(i) + ">") != special_.first_sentinel + i)
        fail(vocab_txt.string(), ": <extra_id_", i, "> is already in the vocabulary at another position");
  }
}

int32_t WordPieceTokenizer::require(const std::filesystem::path& file, const char* token) const {
  auto it = ids_.find(std::string_view(token));
  if (it == ids_.end())
    fail(file.string(), ": the vocabulary has no ", token, " token; is this a BERT vocab.txt?");
  return it->second;
}

std::vector<std::string> WordPieceTokenizer::basic_tokenize(std::string_view text) const {
  std::vector<std::string> words;
  std::string cur;
  auto flush = [&] {
    if (!cur.empty()) words.push_back(std::move(cur));
    cur.clear();
  };
  char32_t lowered[3], stripped[4];
  size_t token_begin = 0;  // where the current whitespace token starts (for the final sigma)
  for (size_t i = 0, len = 0; i < text.size(); i += len) {
    char32_t c = unicode::decode_utf8(text, i, len);
    // _clean_text: drop NUL, U+FFFD, controls (and undecodable bytes); whitespace splits.
    if (dropped(c)) continue;
    // Whitespace splits; U+2028/U+2029 survive _clean_text but Python's str.split() splits on them.
    if (unicode::assigned_in_bert_reference(c) && (is_bert_whitespace(c) || c == 0x2028 || c == 0x2029)) {
      flush();
      token_begin = i + len;
      continue;
    }
    if (is_cjk(c)) {  // each CJK ideograph is a word of its own
      flush();
      std::string w;
      unicode::append_utf8(w, c);
      words.push_back(std::move(w));
      token_begin = i + len;
      continue;
    }
    // A character newer than the reference's Unicode data is unassigned to it: kept as it is.
    if (!unicode::assigned_in_bert_reference(c)) {
      unicode::append_utf8(cur, c);
      continue;
    }
    // lower() of the whole token (Greek capital sigma depends on its neighbours), then NFD
    // and drop Mn, one code point at a time.
    int nl = 1;
    if (!lower_case_)
      lowered[0] = c;
    else if (c == 0x3A3)
      lowered[0] = lower_sigma(text, token_begin, i, len);
    else
      nl = unicode::to_lower(c, lowered);
    for (int a = 0; a < nl; ++a) {
      const int ns = lower_case_ ? unicode::strip_accents(lowered[a], stripped) : (stripped[0] = lowered[a], 1);
      for (int b = 0; b < ns; ++b) {
        const char32_t d = stripped[b];
        if (is_bert_punct(d)) {
          flush();
          std::string w;
          unicode::append_utf8(w, d);
          words.push_back(std::move(w));
        } else {
          unicode::append_utf8(cur, d);
        }
      }
    }
  }
  flush();
  return words;
}

void WordPieceTokenizer::wordpiece(std::string_view word, size_t num_chars, std::vector<int32_t>& out) const {
  if (num_chars > kMaxCharsPerWord) {
    out.push_back(special_.unk);
    return;
  }
  const size_t mark = out.size();
  std::string piece;
  size_t start = 0;
  while (start < word.size()) {
    // Longest prefix of word[start:] in the vocabulary (with "##" after the first piece).
    size_t end = word.size();
    int32_t found = -1;
    while (end > start) {
      piece.assign(start > 0 ? "##" : "");
      piece.append(word.substr(start, end - start));
      auto it = ids_.find(std::string_view(piece));
      if (it != ids_.end()) {
        found = it->second;
        break;
      }
      --end;  // step back one code point
      while (end > start && (static_cast<uint8_t>(word[end]) & 0xC0) == 0x80) --end;
    }
    if (found < 0) {
      out.resize(mark);
      out.push_back(special_.unk);
      return;
    }
    out.push_back(found);
    start = end;
  }
}

void WordPieceTokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  for (const std::string& w : basic_tokenize(text)) {
    size_t chars = 0;
    for (const char ch : w) chars += (static_cast<uint8_t>(ch) & 0xC0) != 0x80;
    wordpiece(w, chars, out);
  }
}

std::string WordPieceTokenizer::decode(std::span<const int32_t> ids) const {
  // As Megatron's decode: "##" pieces join the previous token, others are space-separated.
  std::string out;
  for (const int32_t id : ids) {
    if (id < 0 || id >= vocab_size())
      fail("WordPiece decode: token id ", id, " is outside the vocabulary [0, ", vocab_size(), ")");
    const std::string& t = tokens_[static_cast<size_t>(id)];
    if (t.starts_with("##")) {
      out.append(t, 2);
    } else {
      if (!out.empty()) out.push_back(' ');
      out += t;
    }
  }
  return out;
}

std::string WordPieceTokenizer::token_text(int32_t id) const {
  if (id < 0 || id >= vocab_size()) fail("WordPiece: token id ", id, " is outside the vocabulary");
  return tokens_[static_cast<size_t>(id)];
}

}  // namespace megabatch::data
