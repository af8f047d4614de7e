// `pdserve bench spec` on the tiny draft/target pair: it runs and prints one row per batch with
// the measured acceptance (above one half for this pair) and an expected speed-up. (Speed
// itself is not tested; this keeps the benchmark from rotting.)
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/clock.h"
#include "testing/processes.h"
#include "testing/test_models.h"

namespace pdserve {
namespace {

TEST(BenchSpecTest, PrintsARowPerBatchWithItsAcceptance) {
  const testing::CommandRun run = testing::RunPdserve(
      {"bench", "spec", "--model",
       testing::SyntheticModelDir("tiny", {.quiet_from_layer = 2, .quiet_scale = 0.05f}),
       "--speculative", "draft", "--draft-model",
       testing::SyntheticModelDir("tiny", {.num_layers = 2}), "--num-speculative-tokens", "3",
       "--batch", "1,3", "--prompt-len", "8", "--max-tokens", "24", "--threads", "1"},
      Deadline::AfterMs(300'000));
  ASSERT_TRUE(run.finished && run.exit.success()) << run.exit.ToString() << "\n" << run.output;
  std::istringstream lines(run.output);
  std::vector<int> batches;
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::vector<double> values;
    for (double v; fields >> v;) values.push_back(v);
    if (values.size() != 11 || !fields.eof()) continue;  // the header and log lines
    const int batch = static_cast<int>(values[0]);
    const double alpha = values[1];
    batches.push_back(batch);
    EXPECT_GT(alpha, 0.5) << line;
    EXPECT_LE(alpha, 1.0) << line;
  }
  EXPECT_EQ(batches, (std::vector<int>{1, 3})) << run.output;
}

}  // namespace
}  // namespace pdserve
