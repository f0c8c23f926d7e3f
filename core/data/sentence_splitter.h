// A rule-based English sentence splitter for `preprocess --split-sentences`.
//
// Megatron uses NLTK's punkt model, which is not packaged for offline use here. This
// splitter ends a sentence after . ! or ? (with any closing quotes or brackets) when
// whitespace and a plausible sentence start (upper-case letter, digit, opening quote or
// bracket) follow, unless the word before the period is a known abbreviation (Mr., Dr.,
// e.g., Jan., U.S. ...) or a single letter (an initial). A blank line always ends a
// sentence. With keep_newlines the sentences keep their inner line breaks; otherwise
// runs of whitespace containing a newline become one space.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace megabatch::data {

std::vector<std::string> split_sentences(std::string_view text, bool keep_newlines);

}  // namespace megabatch::data
