#include "core/data/brown.h"

#include <algorithm>
#include <cctype>
#include <map>

#include "core/util/error.h"
#include "core/util/files.h"

namespace megabatch::data {

namespace fs = std::filesystem;

std::string detag_sentence(std::string_view line) {
  std::string out;
  bool glue_next = true;  // no space before the first word or after an opening mark
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
    if (i >= line.size()) break;
    size_t j = i;
    while (j < line.size() && line[j] != ' ' && line[j] != '\t' && line[j] != '\r') ++j;
    std::string_view tok = line.substr(i, j - i);
    i = j;
    const size_t slash = tok.rfind('/');
    std::string_view word = (slash == std::string_view::npos || slash == 0) ? tok : tok.substr(0, slash);
    const bool opening = word == "``" || word == "(" || word == "[";
    const bool closing = word == "''" || word == "," || word == "." || word == ";" || word == ":" ||
                         word == "?" || word == "!" || word == ")" || word == "]";
    if (word == "``" || word == "''") word = "\"";
    if (!glue_next && !closing) out.push_back(' ');
    out.append(word);
    glue_next = opening;
  }
  return out;
}

std::vector<BrownDocument> read_brown(const fs::path& dir) {
  if (!fs::is_directory(dir))
    fail(dir.string(), ": Brown corpus directory not found; run ./setup.sh to install it");
  std::map<std::string, std::string> categories;
  if (fs::exists(dir / "cats.txt")) {
    const std::string cats = read_file(dir / "cats.txt", "Brown categories");
    for_each_line(cats, [&](std::string_view line, size_t) {
      const size_t sp = line.find(' ');
      if (sp != std::string_view::npos) categories[std::string(line.substr(0, sp))] = std::string(line.substr(sp + 1));
    });
  }
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.size() == 4 && name[0] == 'c' && name[1] >= 'a' && name[1] <= 'r' && std::isdigit(static_cast<unsigned char>(name[2])) &&
        std::isdigit(static_cast<unsigned char>(name[3])))
      files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) fail(dir.string(), ": no Brown corpus files (ca01 ... cr09); run ./setup.sh");
  std::vector<BrownDocument> docs;
  docs.reserve(files.size());
  for (const auto& f : files) {
    BrownDocument doc;
    doc.id = f.filename().string();
    auto cat = categories.find(doc.id);
    doc.category = cat == categories.end() ? "" : cat->second;
    const std::string text = read_file(f, "Brown corpus file");
    for_each_line(text, [&](std::string_view line, size_t line_no) {
      if (line.find_first_not_of(" \t") == std::string_view::npos) return;
      if (line.find('/') == std::string_view::npos)
        fail(f.string(), ":", line_no, ": expected tagged words (word/tag), got \"", line.substr(0, 60), "\"");
      std::string s = detag_sentence(line);
      if (!s.empty()) doc.sentences.push_back(std::move(s));
    });
    if (doc.sentences.empty()) fail(f.string(), ": no sentences; the corpus file is empty or damaged");
    docs.push_back(std::move(doc));
  }
  return docs;
}

}  // namespace megabatch::data
