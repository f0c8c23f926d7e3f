// The benchmark programs (bench/) on a bad command line: one message that names the program
// once and the flag, exit status 2 for a flag the parser refuses (1 for a value it reads but
// the program refuses), and all of it before a device is touched or a row is measured. On a
// machine without a GPU, a GPU benchmark's typo is reported as the typo, not as the missing GPU;
// on one with a GPU, before the rows ahead of it have run for minutes. Nothing reaches
// std::terminate (a number that did not parse used to, outside main's try).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/unit/test_util.h"

namespace mb = megabatch;

namespace {

struct Case {
  std::string program, args;
  int exit_code;
  std::string says;  // after "<program>: "
};

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(BenchFlags, ABadFlagIsOneMessageNamingItBeforeAnyDeviceOrRow) {
  const std::vector<Case> cases = {
      {"attention_bench", "--seqs 512 abc", 2, "--seqs: expected an integer, got 'abc'"},
      {"attention_bench", "--seq 512", 2, "unknown option --seq"},
      {"attention_bench", "--torch yes", 2, "--torch: expected one of true, false, got 'yes'"},
      {"attention_bench", "--head-sizes 64 96", 1, "--head-sizes: the flash kernels' head sizes are 64 and 128, not 96"},
      {"gpu_train_bench", "--steps x", 2, "--steps: expected an integer, got 'x'"},
      {"gpu_train_bench", "--peak-tflops many", 2, "--peak-tflops: expected a finite number, got 'many'"},
      {"gpu_train_bench", "--optimizers adamw lamm", 1, "unknown optimizer plugin 'lamm'"},
      {"gpu_train_bench", "--torch-modes sdpa eager", 1, "--torch-modes: explicit, sdpa or compile, not 'eager'"},
      {"gpu_train_bench", "--dtype f8", 2, "--dtype: expected one of f32, bf16, fp16, got 'f8'"},
      {"optim_bench", "--steps x", 2, "--steps: expected an integer, got 'x'"},
      {"optim_bench", "--models gpt-mini,gpt3", 1, "unknown model preset 'gpt3'"},
      {"train_bench", "--threads 2x", 2, "--threads: expected an integer, got '2x'"},
      {"train_bench", "--baseline /nonexistent/old/bench", 1, "--baseline /nonexistent/old/bench: not an executable"},
      {"cross_entropy_bench", "--dtype fp8", 2, "--dtype: expected one of f32, bf16, f16, got 'fp8'"},
      {"tokenizer_bench", "--repeat 0", 1, "--repeat 0: at least 1"},
  };
  for (const Case& c : cases) {
    const auto r = mb::testing::run_command(mb::testing::bin_dir() + "/" + c.program + " " + c.args);
    SCOPED_TRACE(c.program + " " + c.args + "\n" + r.output);
    EXPECT_EQ(r.exit_code, c.exit_code);
    EXPECT_EQ(r.output.rfind(c.program + ": " + c.says, 0), 0u);  // the first line, the program's name once
    EXPECT_EQ(count(r.output, c.program + ":"), 1u);
    EXPECT_EQ(r.output.find("terminate"), std::string::npos);
    EXPECT_EQ(r.output.find("GPU"), std::string::npos);  // not the device's error
  }
}

}  // namespace
