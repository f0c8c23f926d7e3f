// The step recorder (core/train/step_recorder.h) on the CPU: each step's time reaches
// metrics.h5 as the trainer measured it (a CPU read waits for nothing), and a ring that fills
// is drained at its last step, not at the start of the next. (On a GPU, where the read at a
// drain waits for the steps the host queued ahead and that wait lands in the last step's time:
// test_gpu.cc, Gpu.StepTimesCountTheWaitForTheStepsTheHostQueuedAhead.)
#include <gtest/gtest.h>

#include <sstream>

#include "core/io/metrics.h"
#include "core/train/step_recorder.h"
#include "tests/unit/test_util.h"

namespace mb = megabatch;

TEST(StepRecorder, StepTimesReachMetricsAndAFullRingDrainsAtItsLastStep) {
  mb::testing::TempDir tmp;
  mb::train::TrainOptions o;
  o.log_interval = 3;  // a ring of 3 rows
  std::ostringstream console;
  {
    mb::io::MetricsFile metrics(tmp / "metrics.h5", nlohmann::json::object());
    mb::train::StepRecorder recorder(o, false, &metrics, console);
    recorder.allocate({}, mb::Device::cpu());
    for (int64_t it = 1; it <= 3; ++it) {
      recorder.begin_step();
      recorder.record(it, 8 * it, 8, 1e-3, 0.25 * static_cast<double>(it));  // 250, 500, 750 ms
    }
    EXPECT_EQ(recorder.losses_drained().size(), 3u) << "drained at the third step, which filled the ring";
  }
  auto series = mb::io::read_metric_series(tmp / "metrics.h5");
  const auto& ms = series["train/iteration_time_ms"];
  ASSERT_EQ(ms.size(), 3u);
  // the first two as the trainer gave them; the third's drain (a copy in host memory) adds its
  // wait, whatever it is on this machine, to the third alone
  EXPECT_EQ(ms[0], 250.0);
  EXPECT_EQ(ms[1], 500.0);
  EXPECT_GE(ms[2], 750.0);
  EXPECT_EQ(series["train/consumed_samples"], (std::vector<double>{8, 16, 24}));
}
