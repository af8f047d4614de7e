// `pdserve bench engine` on the tiny synthetic model: it runs, and prints one table row per
// phase with a ratio to its ceiling. (Speed itself is not tested; this keeps the benchmark
// from rotting.)
#include <cstdio>
#include <regex>
#include <string>

#include <gtest/gtest.h>

#include "testing/test_models.h"
#include "testing/test_paths.h"

namespace pdserve {
namespace {

// Runs a shell command; returns its stdout and puts the exit status in *status.
std::string RunShell(const std::string& command, int* status) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), pipe)) out.append(buf, n);
  *status = pclose(pipe);
  return out;
}

std::string BenchCommand(const std::string& extra) {
  return testing::BinaryPath("src/cli/pdserve") + " bench engine --model " +
         testing::TinyModelDir() +
         " --batch 1,3 --prompt-len 20 --decode-steps 2 --repeats 2 --threads 1 " + extra + " 2>&1";
}

// Checks the table: one prefill row and one decode row per batch, each naming `path`.
void ExpectTable(const std::string& out, const std::string& path) {
  const std::regex row(
      R"(\| (prefill 20|decode ctx 20) \| ([a-z0-9]+) \| (\d+) \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ (GFLOP/s|GB/s) \| [0-9.]+ \| \d+% \|)");
  int rows = 0;
  std::string batches;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), row); it != std::sregex_iterator();
       ++it) {
    ++rows;
    EXPECT_EQ((*it)[2].str(), path) << out;
    batches += (*it)[3].str() + ",";
  }
  EXPECT_EQ(rows, 3) << out;
  EXPECT_EQ(batches, "1,1,3,") << out;
  EXPECT_NE(out.find("medians of 2 rounds; in each round the best run"), std::string::npos) << out;
  // The compute ceiling is oneDNN bf16 where the CPU has it, else f32: never absent.
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(oneDNN (bf16|f32) GEMM [0-9.]+ GFLOP/s)")))
      << out;
}

TEST(BenchEngineTest, PrintsEveryPhaseBesideItsCeiling) {
  int status = -1;
  const std::string out = RunShell(BenchCommand(""), &status);
  ASSERT_EQ(status, 0) << out;
  const std::smatch m = [&] {
    std::smatch match;
    std::regex_search(out, match, std::regex(R"(\| prefill 20 \| ([a-z0-9]+) \|)"));
    return match;
  }();
  ASSERT_FALSE(m.empty()) << out;
  ExpectTable(out, m[1].str());
}

// The portable path runs on every CPU, and the table says it is the one that ran.
TEST(BenchEngineTest, KernelsFlagChoosesThePath) {
  int status = -1;
  const std::string out = RunShell(BenchCommand("--kernels generic"), &status);
  ASSERT_EQ(status, 0) << out;
  ExpectTable(out, "generic");
  const std::string bad = RunShell(BenchCommand("--kernels sse9"), &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(bad.find("sse9"), std::string::npos) << bad;
}

TEST(BenchEngineTest, BadBatchListIsAClearError) {
  int status = -1;
  const std::string out =
      RunShell(testing::BinaryPath("src/cli/pdserve") + " bench engine --model " +
                   testing::TinyModelDir() + " --batch 1,x 2>&1",
               &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("--batch"), std::string::npos) << out;
}

}  // namespace
}  // namespace pdserve
