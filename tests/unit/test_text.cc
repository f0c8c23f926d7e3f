// Brown de-tagging and the rule-based sentence splitter, against hand-written expectations.
#include <gtest/gtest.h>

#include "core/data/brown.h"
#include "core/data/sentence_splitter.h"

namespace megabatch::data {
namespace {

TEST(Brown, DetagKeepsWordsAndJoinsPunctuation) {
  // The first sentence of ca01, as tagged in the corpus.
  EXPECT_EQ(detag_sentence("\tThe/at Fulton/np-tl County/nn-tl said/vbd ``/`` no/at evidence/nn ''/'' that/cs "
                           "any/dti irregularities/nns took/vbd place/nn ./."),
            "The Fulton County said \"no evidence\" that any irregularities took place.");
  EXPECT_EQ(detag_sentence("a/at (/( b/nn )/) ,/, c/nn ;/. d/nn ?/. e/nn !/. f/nn :/: g/nn"), "a (b), c; d? e! f: g");
  EXPECT_EQ(detag_sentence("1/2/cd and/cc/x Atlanta's/np$"), "1/2 and/cc Atlanta's") << "the tag is after the last '/'";
}

TEST(SentenceSplitter, SplitsAtSentenceEndsButNotAtAbbreviationsOrInitials) {
  EXPECT_EQ(split_sentences("The cat sat. Then it left! Did it? Yes.", false),
            (std::vector<std::string>{"The cat sat.", "Then it left!", "Did it?", "Yes."}));
  EXPECT_EQ(split_sentences("Mr. Smith met Dr. Jones. J. R. Tolkien wrote e.g. books.", false),
            (std::vector<std::string>{"Mr. Smith met Dr. Jones.", "J. R. Tolkien wrote e.g. books."}));
  EXPECT_EQ(split_sentences("He said \"stop.\" Then he left. version 3.14 is out.", false),
            (std::vector<std::string>{"He said \"stop.\"", "Then he left. version 3.14 is out."}));
  EXPECT_EQ(split_sentences("a title\n\nbody line\ncontinues here", false),
            (std::vector<std::string>{"a title", "body line continues here"}));
  EXPECT_EQ(split_sentences("body line\ncontinues here", true), (std::vector<std::string>{"body line\ncontinues here"}));
  EXPECT_TRUE(split_sentences("   \n  ", false).empty());
}

}  // namespace
}  // namespace megabatch::data
