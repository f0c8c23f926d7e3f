// The sweep tests' fixture (test_sweep.cc, test_sweep_file.cc, test_sweep_outputs.cc): small
// sweep files of a tiny GPT on the Brown corpus, and the sweep program run on them.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/unit/h5_util.h"
#include "tests/unit/test_util.h"

namespace megabatch::testing {

namespace fs = std::filesystem;

class Sweep : public ::testing::Test {
 public:
  // A sweep file: tiny GPT, lamb and adamw, batch sizes 4 and 8, `budget` samples each.
  static fs::path write_sweep(const fs::path& dir, const std::string& name, int budget, const std::string& optimizers,
                              const std::string& extra_base = "") {
    const fs::path file = dir / (name + ".json");
    write_text(file, R"({
  "name": ")" + name + R"(",
  "base": {"num_layers": 1, "hidden_size": 32, "num_attention_heads": 2, "seq_length": 16,
           "micro_batch_size": 4, "lr": 0.002, "log_interval": 1, "eval_interval": 1000, "eval_iters": 2,
           "data_path": [")" + (brown_data() / "brown_gpt2_text_document").string() + R"("],
           "hidden_dropout": 0.1, "attention_dropout": 0.1)" + extra_base + R"(},
  "grid": {"optimizer": [)" + optimizers + R"(]},
  "zip": {"global_batch_size": [4, 8]},
  "seeds": [3],
  "derive": {"lr_scaling": {"rule": "sqrt", "ref_batch": 4}, "sample_budget": )" + std::to_string(budget) + R"(},
  "jobs": 2, "threads": 1
})");
    return file;
  }
  // A sweep file of one tiny GPT logging every iteration: `base` adds to its base, `rest` is
  // the file's other keys (grid, threads, jobs).
  static fs::path write_tiny_sweep(const fs::path& dir, const std::string& name, const std::string& base,
                                   const std::string& rest) {
    const fs::path file = dir / (name + ".json");
    write_text(file, R"({"name": ")" + name + R"(",
  "base": {"num_layers": 1, "hidden_size": 32, "num_attention_heads": 2, "seq_length": 16, "micro_batch_size": 2,
           "lr": 0.001, "log_interval": 1, "eval_iters": 0, )" + base + R"(,
           "data_path": [")" + (brown_data() / "brown_gpt2_text_document").string() + R"("]},
  )" + rest + "}");
    return file;
  }
  // Shell: wait (up to five minutes on a loaded machine) until the log shows the third iteration.
  static std::string wait_for_third(const std::string& log) {
    return wait_for_line(log, "iteration  *[3-9]/");
  }
  static std::string sweep(const std::string& args) { return bin_dir() + "/sweep " + args; }
  // sweep run FILE --runs-dir RUNS [extra flags]
  static CommandResult run_sweep(const fs::path& file, const fs::path& runs, const std::string& extra = "") {
    return run_command(sweep("run " + file.string() + " --runs-dir " + runs.string() + extra));
  }
};

inline std::vector<double> losses(const fs::path& metrics) {
  H5File f(metrics.string(), H5File::kRead);
  return f.read<double>("train/lm_loss");
}

inline const std::vector<std::string> kIds = {"lamb-bs4-lr0.002-s3", "lamb-bs8-lr0.00283-s3", "adamw-bs4-lr0.002-s3",
                                       "adamw-bs8-lr0.00283-s3"};

}  // namespace megabatch::testing
