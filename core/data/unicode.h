// Unicode character classes and mappings used by the tokenizers.
//
// Tables are generated from Node.js's Unicode data by gen_unicode_tables.js (see there
// for why). UTF-8 decoding is lenient: a byte that does not start a valid sequence is
// returned as one "invalid" unit so byte-level tokenizers can still round-trip it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace megabatch::unicode {

constexpr char32_t kInvalid = 0xFFFFFFFF;

// Decodes one code point at s[i]; sets len to the bytes consumed (>= 1). Overlong
// forms, surrogates, values above U+10FFFF and truncated sequences give kInvalid, len 1.
char32_t decode_utf8(std::string_view s, size_t i, size_t& len);
void append_utf8(std::string& out, char32_t c);

bool is_letter(char32_t c);     // \p{L}
bool is_number(char32_t c);     // \p{N}
bool is_js_space(char32_t c);   // JavaScript's \s
bool is_punct(char32_t c);      // general category P*
bool is_space_sep(char32_t c);  // general category Zs
bool is_control(char32_t c);    // general categories Cc, Cf
bool is_nonspacing_mark(char32_t c);  // general category Mn

// Full lower-case mapping of one code point (1 or 2 code points); returns the count.
int to_lower(char32_t c, char32_t out[3]);
// Canonical decomposition of one code point with non-spacing marks dropped (0..3 code
// points; Hangul syllables decompose into jamo); returns the count.
int strip_accents(char32_t c, char32_t out[4]);

const char* table_version();

// Whether c is assigned in the Unicode version of the reference BERT tokenizer (Python's
// unicodedata, gen_bert_unicode_assigned.py: Debian 12's Python, Unicode 14.0). Newer
// characters are unassigned to it, and the WordPiece tokenizer treats them as it does.
bool assigned_in_bert_reference(char32_t c);
const char* bert_reference_version();

}  // namespace megabatch::unicode
