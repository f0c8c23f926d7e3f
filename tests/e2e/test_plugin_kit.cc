// The plugin kit, as a researcher uses it: megabatch installed under a prefix, and optimizer
// plugins built out of tree against its CMake package (with nvcc where it was built with
// CUDA): the plugin that plugins/README.md shows, a LAMB variant that subclasses the installed
// LAMB, and plugins/example (Adafactor), each trained and compared with what it must equal.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "core/device/runtime.h"
#include "tests/unit/h5_util.h"
#include "tests/unit/test_util.h"

namespace mb = megabatch;
namespace fs = std::filesystem;

namespace {
// The plugin kit's commands, as a user types them: each must succeed.
mb::testing::CommandResult run(const std::string& cmd) {
  const auto r = mb::testing::run_command(cmd + " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
  return r;
}
// Installs this build under `prefix` (bin/, the header, the CMake package) and builds the plugin
// project in `src` against it, in src/build, for one CUDA architecture (which keeps it short).
// Returns the build's output, its compile lines included.
std::string build_out_of_tree(const fs::path& prefix, const fs::path& src) {
  run("cmake --install " + fs::path(mb::testing::bin_dir()).parent_path().string() + " --prefix " + prefix.string());
  EXPECT_TRUE(fs::exists(prefix / "include" / "megabatch" / "plugin.h"));
  EXPECT_TRUE(fs::exists(prefix / "include" / "megabatch" / "plugin_kit.h"));
  EXPECT_TRUE(fs::exists(prefix / "lib" / "cmake" / "megabatch" / "megabatchConfig.cmake"));
  run("cmake -S " + src.string() + " -B " + (src / "build").string() + " -DCMAKE_PREFIX_PATH=" + prefix.string() +
      " -DCMAKE_CUDA_ARCHITECTURES=75");
  return run("cmake --build " + (src / "build").string() + " --verbose").output;
}
}  // namespace

// The plugin that plugins/README.md shows ("The shape of a plugin"), copied out of the page as
// a reader would, with the three-line CMakeLists.txt that the page describes: it builds against
// the installed package and is an optimizer. At beta 0 its update is w -= lr * g, which is the
// shipped sgd plugin with momentum 0 and no weight decay, so the two train to the same losses,
// bit for bit; and its momentum lands in checkpoints under the name the page gives it.
TEST(PluginKit, TheReadmesPluginBuildsAndTrainsAsPlainSgdAtBetaZero) {
  mb::testing::TempDir tmp;
  const fs::path prefix = tmp / "prefix", src = tmp / "my_optimizer";
  const std::string page = mb::testing::read_text(fs::path(mb::testing::source_dir()) / "plugins" / "README.md");
  const size_t open = page.find("```cpp\n");
  ASSERT_NE(open, std::string::npos) << "plugins/README.md has no ```cpp block";
  const size_t body = open + 7, close = page.find("```", body);
  ASSERT_NE(close, std::string::npos);
  fs::create_directories(src);
  mb::testing::write_text(src / "my_optimizer.cc", page.substr(body, close - body));
  mb::testing::write_text(src / "CMakeLists.txt",
                          "cmake_minimum_required(VERSION 3.20)\nproject(my_optimizer CXX)\n"
                          "set(CMAKE_CXX_STANDARD 17)\nfind_package(megabatch REQUIRED)\n"
                          "megabatch_add_plugin(my_optimizer my_optimizer.cc)\n");
  const std::string built = build_out_of_tree(prefix, src);
  ASSERT_TRUE(fs::exists(src / "build" / "plugins" / "megabatch_my_optimizer.so"));
  // the page's CMakeLists.txt names no build type: the plugin is optimized all the same (built at
  // -O0, it made an iteration of an 82M-parameter GPT take 293 ms, against 177 ms at -O3)
  EXPECT_NE(built.find(" -O3 "), std::string::npos) << built;

  run(prefix.string() + "/bin/preprocess brown --output-dir " + (tmp / "data").string());
  const std::string train = prefix.string() + "/bin/train --num-layers 1 --hidden-size 32 --num-attention-heads 2 "
                            "--seq-length 16 --micro-batch-size 2 --train-iters 6 --lr 0.5 --log-interval 1 "
                            "--eval-iters 0 --threads 1 --plugin-path " + (src / "build" / "plugins").string() +
                            " --data-path " + (tmp / "data" / "brown_gpt2_text_document").string();
  const auto mine = run(train + " --optimizer my_optimizer --optimizer-params beta=0 --run-dir " + (tmp / "mine").string() +
                        " --save " + (tmp / "mine" / "ckpt").string());
  EXPECT_NE(mine.output.find("optimizer: my_optimizer 0.1.0"), std::string::npos) << mine.output;
  run(train + " --optimizer sgd --optimizer-params momentum=0 --optimizer-params weight_decay=0 --run-dir " +
      (tmp / "sgd").string());
  const auto a = mb::testing::H5File((tmp / "mine" / "metrics.h5").string(), mb::testing::H5File::kRead).read<double>("train/lm_loss");
  const auto b = mb::testing::H5File((tmp / "sgd" / "metrics.h5").string(), mb::testing::H5File::kRead).read<double>("train/lm_loss");
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(a, b) << "the README's plugin at beta 0 and sgd at momentum 0 step identically";
  EXPECT_LT(a.back(), a.front()) << "SGD at lr 0.5 lowers the loss of a fresh model within 6 steps";
  mb::testing::H5File c((tmp / "mine" / "ckpt" / "iter_0000006.h5").string(), mb::testing::H5File::kRead);
  EXPECT_EQ(c.read<float>("optimizer/decoder.layers.0.self_attention.linear_qkv.weight/exp_avg").size(), 96u * 32u);
}

// A LAMB variant out of tree: lamb_embscale's own source, with its include of LAMB's math
// pointed at the installed <megabatch/plugins/lamb.h> and a name of its own, builds against
// the installed package and steps exactly as the shipped lamb_embscale (losses bit for bit,
// with an embedding multiplier that makes it differ from plain LAMB).
TEST(PluginKit, ALambVariantSubclassesTheInstalledLambOutOfTree) {
  mb::testing::TempDir tmp;
  const fs::path prefix = tmp / "prefix", src = tmp / "my_embscale";
  std::string code = mb::testing::read_text(fs::path(mb::testing::source_dir()) / "plugins" / "lamb_embscale" / "lamb_embscale.cc");
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"\"../lamb/lamb.h\"", "<megabatch/plugins/lamb.h>"},
                                 {"\"lamb_embscale\"", "\"my_embscale\""}}) {
    const size_t at = code.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    code.replace(at, from.size(), to);
  }
  fs::create_directories(src);
  mb::testing::write_text(src / "my_embscale.cc", code);
  mb::testing::write_text(src / "CMakeLists.txt",
                          "cmake_minimum_required(VERSION 3.20)\nproject(my_embscale CXX)\n"
                          "find_package(megabatch REQUIRED)\nmegabatch_add_plugin(my_embscale my_embscale.cc)\n");
  build_out_of_tree(prefix, src);
  ASSERT_TRUE(fs::exists(src / "build" / "plugins" / "megabatch_my_embscale.so"));

  run(prefix.string() + "/bin/preprocess brown --output-dir " + (tmp / "data").string());
  const std::string train = prefix.string() + "/bin/train --num-layers 1 --hidden-size 32 --num-attention-heads 2 "
                            "--seq-length 16 --micro-batch-size 2 --train-iters 6 --lr 0.01 --log-interval 1 "
                            "--eval-iters 0 --threads 1 --plugin-path " +
                            (src / "build" / "plugins").string() + " --data-path " +
                            (tmp / "data" / "brown_gpt2_text_document").string();
  std::vector<std::vector<double>> losses;
  for (const char* name : {"my_embscale", "lamb_embscale", "lamb"}) {
    const std::string hp = std::string(name) == "lamb" ? "" : " --optimizer-params multiplier=4";
    const auto r = run(train + " --optimizer " + name + hp + " --run-dir " + (tmp / name).string());
    EXPECT_NE(r.output.find(std::string("optimizer: ") + name), std::string::npos) << r.output;
    losses.push_back(mb::testing::H5File((tmp / name / "metrics.h5").string(), mb::testing::H5File::kRead).read<double>("train/lm_loss"));
  }
  ASSERT_EQ(losses[0].size(), 6u);
  EXPECT_EQ(losses[0], losses[1]) << "the variant built out of tree steps as the shipped one";
  EXPECT_NE(losses[0], losses[2]) << "its embedding multiplier (the overridden hook) takes effect: not plain LAMB";
}

// The plugin kit: install megabatch, build plugins/example (Adafactor, with per-row and
// per-column state) out of tree against the installed CMake package (with nvcc where the
// package was built with CUDA), train with it from --plugin-path, checkpoint its factored
// state in its own shapes and resume from it, then install it next to the shipped plugins
// and train again without --plugin-path.
TEST(PluginKit, ExamplePluginBuildsOutOfTreeAgainstTheInstalledPackageAndTrains) {
  mb::testing::TempDir tmp;
  const fs::path prefix = tmp / "prefix", src = tmp / "adafactor";
  fs::copy(fs::path(mb::testing::source_dir()) / "plugins" / "example", src, fs::copy_options::recursive);
  build_out_of_tree(prefix, src);
  ASSERT_TRUE(fs::exists(src / "build" / "plugins" / "megabatch_adafactor.so"));
  const std::string plugins = " --plugin-path " + (src / "build" / "plugins").string();
  const auto listed = run(prefix.string() + "/bin/train --list-optimizers" + plugins);
  EXPECT_NE(listed.output.find(mb::runtime::built_with_cuda() ? "runs on: cpu, cuda" : "runs on: cpu\n"), std::string::npos)
      << listed.output;

  run(prefix.string() + "/bin/preprocess brown --output-dir " + (tmp / "data").string());
  const std::string train = prefix.string() + "/bin/train --num-layers 1 --hidden-size 32 --num-attention-heads 2 "
                            "--seq-length 16 --micro-batch-size 2 --train-iters 4 --lr 1e-2 --log-interval 1 "
                            "--eval-iters 0 --threads 1 --optimizer adafactor --optimizer-params clip_threshold=1 --data-path " +
                            (tmp / "data" / "brown_gpt2_text_document").string();
  const fs::path ckpt = tmp / "run1" / "ckpt";
  const auto r = run(train + " --run-dir " + (tmp / "run1").string() + plugins + " --save " + ckpt.string());
  EXPECT_NE(r.output.find("optimizer: adafactor 0.3.0"), std::string::npos) << r.output;
  mb::testing::H5File f((tmp / "run1" / "metrics.h5").string(), mb::testing::H5File::kRead);
  const auto loss = f.read<double>("train/lm_loss");
  ASSERT_EQ(loss.size(), 4u);
  EXPECT_LT(loss.back(), loss.front()) << "Adafactor at lr 1e-2 lowers the loss of a fresh model within 4 steps";
  {  // the factored state in its own shapes: one value per row and per column of a (96, 32) weight
    mb::testing::H5File c((ckpt / "iter_0000004.h5").string(), mb::testing::H5File::kRead);
    EXPECT_EQ(c.read<float>("optimizer/decoder.layers.0.self_attention.linear_qkv.weight/exp_avg_sq_row").size(), 96u);
    EXPECT_EQ(c.read<float>("optimizer/decoder.layers.0.self_attention.linear_qkv.weight/exp_avg_sq_col").size(), 32u);
    EXPECT_EQ(c.read<float>("optimizer/decoder.layers.0.input_layernorm.weight/exp_avg_sq").size(), 32u);
  }
  // stop at 2, resume: the same final checkpoint, bit for bit (the factored state was restored)
  const fs::path ckpt2 = tmp / "run3" / "ckpt";
  run(train + " --run-dir " + (tmp / "run3").string() + plugins + " --save " + ckpt2.string() + " --exit-interval 2");
  run(train + " --run-dir " + (tmp / "run3").string() + plugins + " --save " + ckpt2.string() + " --load " + ckpt2.string());
  const auto same = mb::testing::run_command(
      "/usr/bin/python3 -c \"import h5py, numpy as np\n"
      "a, b = h5py.File('" + (ckpt / "iter_0000004.h5").string() + "'), h5py.File('" + (ckpt2 / "iter_0000004.h5").string() + "')\n"
      "n = []\n"
      "a.visit(lambda k: n.append(k) if isinstance(a[k], h5py.Dataset) else None)\n"
      "print('differ:', [k for k in n if not np.array_equal(a[k][()], b[k][()])][:3])\"");
  EXPECT_NE(same.output.find("differ: []"), std::string::npos) << same.output;

  run("cmake --install " + (src / "build").string() + " --prefix " + prefix.string());
  const auto r2 = run(train + " --run-dir " + (tmp / "run2").string());
  EXPECT_NE(r2.output.find((prefix / "lib" / "megabatch" / "plugins" / "megabatch_adafactor.so").string()), std::string::npos)
      << r2.output;
}
