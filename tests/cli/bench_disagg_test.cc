// `pdserve bench disagg` on the tiny synthetic model, through the binary: it runs a real
// prefill and decode node over tcp and prints the table with both modes and the plan's figures;
// a prompt with nothing to transfer is refused with a clear error. (The figures' consistency is
// tests/bench/disagg_bench_test.cc; speed itself is not tested.)
#include <regex>
#include <string>

#include <gtest/gtest.h>

#include "common/clock.h"
#include "testing/processes.h"
#include "testing/test_models.h"

namespace pdserve {
namespace {

// `pdserve bench disagg` on the tiny model over tcp, with a prompt of `prompt_len` tokens.
testing::CommandRun RunDisagg(const std::string& prompt_len) {
  return testing::RunPdserve(
      {"bench", "disagg", "--model", testing::TinyModelDir(), "--prompt-len", prompt_len,
       "--repeats", "1", "--threads", "1", "--page-size", "4", "--max-batch-tokens", "8",
       "--kv-cache-mb", "8", "--fabric-provider", "tcp"},
      Deadline::AfterMs(300'000));
}

TEST(BenchDisaggCliTest, PrintsTheTableOfBothModes) {
  const testing::CommandRun run = RunDisagg("30");
  const std::string& out = run.output;
  ASSERT_TRUE(run.finished && run.exit.success()) << run.exit.ToString() << "\n" << out;
  // 29 prefilled tokens: 8 pages of 4.
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(P prefills 29 \(8 pages x \d+ layers\))")))
      << out;
  EXPECT_NE(out.find("| median [min, max] | streaming on | streaming off |"), std::string::npos)
      << out;
  EXPECT_TRUE(std::regex_search(
      out, std::regex(R"(\| transfer tail \(ms\) \| [0-9.]+ \[[0-9.]+, [0-9.]+\] \| [0-9.]+ )")))
      << out;
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(\| forward passes \| 4 \[4, 4\] \| 4 )")))
      << out;
}

TEST(BenchDisaggCliTest, RefusesAPromptWithNothingToTransfer) {
  const testing::CommandRun run = RunDisagg("1");
  EXPECT_TRUE(run.finished && run.exit.exited() && run.exit.code != 0) << run.exit.ToString();
  EXPECT_NE(run.output.find("--prompt-len"), std::string::npos) << run.output;
}

}  // namespace
}  // namespace pdserve
