// The fixture of the `train` end-to-end tests (test_train*.cc, test_divergence.cc): the
// default datasets, a small GPT's flags, a corpus of short documents made per test.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/unit/h5_util.h"
#include "tests/unit/test_util.h"

namespace megabatch::testing {

inline const std::string kSmall =
    "--num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 32 " + threads_flag();

class Train : public ::testing::Test {
 protected:
  // the default datasets (read only: a test writes what it makes under tmp_)
  static const std::filesystem::path& brown() { return brown_data(); }
  static std::string train(const std::string& args) {
    return bin_dir() + "/train --data-path " + (brown() / "brown_gpt2_text_document").string() + " " + args;
  }
  // Another GPT-2 corpus of 120 short documents, made under tmp_; its prefix.
  std::string ferry_corpus() {
    std::string text;
    for (int i = 0; i < 120; ++i)
      text += "In " + std::to_string(1800 + i) + " the ferry at mile " + std::to_string(7 * i % 53) + " carried " +
              std::to_string(13 * i % 97) + " carts across, and the keeper wrote each one down twice.\n\n";
    write_text(tmp_ / "b.txt", text);
    const auto r = run_command(bin_dir() + "/preprocess --input " + (tmp_ / "b.txt").string() + " --output-prefix " +
                               (tmp_ / "b").string() + " --tokenizer-type GPT2BPETokenizer --append-eod");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return (tmp_ / "b").string() + "_text_document";
  }
  // One iteration of a small GPT on the ferry corpus (its documents several to a sample), no
  // dropout: a command to add flags and --run-dir to.
  std::string short_documents_gpt() {
    return bin_dir() + "/train " + kSmall +
           "--micro-batch-size 2 --global-batch-size 2 --train-iters 1 --lr 1e-3 --eval-iters 0 "
           "--hidden-dropout 0 --attention-dropout 0 --data-path " +
           ferry_corpus() + " ";
  }
  // `train ARGS --run-dir tmp_/DIR`, which must succeed: its metrics.h5, to read (and its
  // output into `output`, where given).
  H5File trained(const std::string& dir, const std::string& args, std::string* output = nullptr) {
    const auto r = run_command(bin_dir() + "/train " + args + " --run-dir " + (tmp_ / dir).string());
    EXPECT_EQ(r.exit_code, 0) << r.output;
    if (output) *output = r.output;
    return H5File((tmp_ / dir / "metrics.h5").string(), H5File::kRead);
  }
  // The first iteration line's lm loss as printed ("none" where there is none).
  static std::string first_loss(const std::string& output) {
    const size_t at = output.find(" lm loss: ");
    return at == std::string::npos ? std::string("none") : output.substr(at + 10, 12);
  }
  TempDir tmp_;
};

}  // namespace megabatch::testing
