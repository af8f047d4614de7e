// `pdserve bench disagg` on the tiny synthetic model, through the binary: it runs a real
// prefill and decode node over tcp and prints the table with both modes and the plan's figures;
// a prompt with nothing to transfer is refused with a clear error. (The figures' consistency is
// tests/bench/disagg_bench_test.cc; speed itself is not tested.)
#include <cstdio>
#include <regex>
#include <string>

#include <gtest/gtest.h>

#include "testing/test_models.h"
#include "testing/test_paths.h"

namespace pdserve {
namespace {

std::string RunShell(const std::string& command, int* status) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), pipe)) out.append(buf, n);
  *status = pclose(pipe);
  return out;
}

std::string DisaggCommand(const std::string& prompt_len) {
  return testing::BinaryPath("src/cli/pdserve") + " bench disagg --model " +
         testing::TinyModelDir() + " --prompt-len " + prompt_len +
         " --repeats 1 --threads 1 --page-size 4 --max-batch-tokens 8 --kv-cache-mb 8"
         " --fabric-provider tcp 2>&1";
}

TEST(BenchDisaggCliTest, PrintsTheTableOfBothModes) {
  int status = -1;
  const std::string out = RunShell(DisaggCommand("30"), &status);
  ASSERT_EQ(status, 0) << out;
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
  int status = -1;
  const std::string out = RunShell(DisaggCommand("1"), &status);
  EXPECT_NE(status, 0) << out;
  EXPECT_NE(out.find("--prompt-len"), std::string::npos) << out;
}

}  // namespace
}  // namespace pdserve
