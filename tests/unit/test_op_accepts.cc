// What each backend takes, compared on the CPU for every op (core/ops/accepts.inc): the
// CUDA column may narrow the CPU's (the reference's, which the dispatcher's callers rely on)
// only where its row says why, and every entry point of the backends (backend_ops.inc) has
// rows. Twice a CUDA op refused dtypes its dispatcher accepted (sum into f64,
// weighted_accumulate with f64 terms) and every GPU run with the noise scale stopped at its
// first step, which only a GPU run showed; this test would have failed in CI on both.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>

#include "core/ops/accepts.h"
#include "core/ops/reduce.h"
#include "core/tensor/tensor.h"
#include "core/util/error.h"
#include "tests/unit/test_util.h"

namespace megabatch::ops {
namespace detail {
void expect_accepted(const Accepts& row, const Tensor& t, Device d);  // core/ops/check.h (internal)
}
namespace {

// The entry points every backend implements, read from backend_ops.inc.
std::set<std::string> entry_points() {
  std::ifstream in(testing::source_dir() + "/core/ops/backend_ops.inc");
  std::set<std::string> out;
  const std::regex decl(R"(^void (\w+)\()");
  std::smatch m;
  for (std::string line; std::getline(in, line);)
    if (std::regex_search(line, m, decl)) out.insert(m[1]);
  return out;
}

TEST(OpAccepts, EveryEntryPointOfTheBackendsHasRowsAndEveryRowAnEntryPoint) {
  const auto ops = entry_points();
  ASSERT_GT(ops.size(), 40u) << "backend_ops.inc not found or not parsed";
  std::set<std::string> with_rows;
  for (const Accepts& row : all_accepts()) {
    with_rows.insert(row.op);
    EXPECT_TRUE(ops.count(row.op)) << "a row for '" << row.op << "', which is no entry point of the backends";
  }
  for (const auto& op : ops) EXPECT_TRUE(with_rows.count(op)) << op << " states nowhere what it takes (accepts.inc)";
}

TEST(OpAccepts, CudaNarrowsTheCpuOnlyWhereItsRowSaysWhy) {
  std::set<std::pair<std::string, std::string>> seen;
  int narrowed = 0;
  for (const Accepts& row : all_accepts()) {
    SCOPED_TRACE(std::string(row.op) + "." + row.arg);
    EXPECT_TRUE(seen.insert({row.op, row.arg}).second) << "two rows";
    EXPECT_NE(row.cpu, DTypes{}) << "the CPU takes nothing";
    EXPECT_NE(row.cuda, DTypes{}) << "CUDA takes nothing";
    EXPECT_TRUE(row.cuda.within(row.cpu)) << "CUDA takes " << row.cuda.names() << ", beyond the CPU's "
                                          << row.cpu.names() << ": the CPU is the reference of every dtype";
    const bool same = row.cuda == row.cpu;
    EXPECT_EQ(std::string(row.narrowed).empty(), same)
        << (same ? "a reason for a narrowing there is not" : "CUDA takes " + row.cuda.names() + " where the CPU takes " +
                                                                 row.cpu.names() + ", and the row does not say why");
    narrowed += same ? 0 : 1;
  }
  EXPECT_GT(narrowed, 0) << "f64 activations are the CPU's alone: some rows narrow";
}

// The narrowings the trainer would meet on a GPU are none: what it hands the reductions of
// losses and norms (f32 or f64 results, f64 terms) is what CUDA takes. These are the two
// bugs above, as rows.
TEST(OpAccepts, TheReductionsTakeOnAGpuWhatTheTrainerGivesThem) {
  EXPECT_EQ(accepts::sum_out.cuda, accepts::sum_out.cpu);
  EXPECT_TRUE(accepts::sum_out.cuda.has(DType::kF64));
  EXPECT_EQ(accepts::weighted_accumulate_x.cuda, accepts::weighted_accumulate_x.cpu);
  EXPECT_TRUE(accepts::weighted_accumulate_x.cuda.has(DType::kF64));
}

// The dispatcher reads the same rows: on the CPU a dtype outside the row is refused naming
// the op and the argument, with the row's dtypes; for a CUDA device a dtype the CPU takes and
// CUDA does not is refused with the row's reason, before any kernel.
TEST(OpAccepts, TheDispatcherRefusesByTheRowOfTheDevice) {
  const Tensor x({4}, DType::kF32), half({1}, DType::kBF16), f64({4}, DType::kF64);
  testing::expect_error([&] { sum(half, x, false); }, "sum: out must be f32 or f64, got ");
  EXPECT_NO_THROW(sum(Tensor({1}, DType::kF64), x, false));
  testing::expect_error([&] { detail::expect_accepted(accepts::ce_loss_losses, f64, Device::cuda(0)); },
                        "ce_loss: losses is f64, which the CUDA kernels do not take (f32): f64 losses come only with "
                        "f64 logits");
  testing::expect_error([&] { detail::expect_accepted(accepts::sum_x, f64, Device::cuda(0)); },
                        std::string("sum: x is f64, which the CUDA kernels do not take (f32, bf16 or f16): ") +
                            accepts::kF64IsTheReference);
  EXPECT_NO_THROW(detail::expect_accepted(accepts::sum_out, f64, Device::cuda(0)));
  EXPECT_NO_THROW(detail::expect_accepted(accepts::weighted_accumulate_x, f64, Device::cuda(0)));
}

}  // namespace
}  // namespace megabatch::ops
