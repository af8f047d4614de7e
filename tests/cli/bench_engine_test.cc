// `pdserve bench engine` on the tiny synthetic model: it runs, and prints one table row per
// phase (decode: per context and batch) with a ratio to its ceiling. (Speed itself is not tested;
// this keeps the benchmark from rotting.)
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

std::string BenchCommand(const std::string& extra, const std::string& contexts = "20") {
  return testing::BinaryPath("src/cli/pdserve") + " bench engine --model " +
         testing::TinyModelDir() + " --batch 1,3 --context " + contexts +
         " --prompt-len 20 --decode-steps 2 --repeats 2 --threads 1 " + extra + " 2>&1";
}

// Every row of the table as "phase/batch" ("prefill 20/1,decode ctx 20/1,..."), each checked
// to name `path` and to carry a ratio and its bound, and a decode row its ratio to the bandwidth
// ceiling alone: never above the ratio to the lower of the two ceilings, and equal to it where
// the bandwidth binds.
std::string TableRows(const std::string& out, const std::string& path) {
  const std::regex row(
      R"(\| (prefill \d+|decode ctx \d+) \| ([a-z0-9]+) \| (\d+) \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ (GFLOP/s|GB/s) \| [0-9.]+ \| (\d+)% \| (bandwidth|GEMM) \| (-|\d+%) \|)");
  std::string rows;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), row); it != std::sregex_iterator();
       ++it) {
    const std::smatch& m = *it;
    EXPECT_EQ(m[2].str(), path) << out;
    const std::string of_bandwidth = m[7].str();
    if (m[1].str().starts_with("prefill")) {
      EXPECT_EQ(of_bandwidth, "-") << m[0];
    } else {
      EXPECT_NE(of_bandwidth, "-") << m[0];
      if (of_bandwidth == "-") continue;
      const int bandwidth_pct = std::stoi(of_bandwidth), pct = std::stoi(m[5].str());
      EXPECT_LE(bandwidth_pct, pct) << m[0];
      if (m[6].str() == "bandwidth") {
        EXPECT_EQ(bandwidth_pct, pct) << m[0];
      }
    }
    rows += m[1].str() + "/" + m[3].str() + ",";
  }
  return rows;
}

// Checks the table: one prefill row and one decode row per batch, each naming `path`.
void ExpectTable(const std::string& out, const std::string& path) {
  EXPECT_EQ(TableRows(out, path), "prefill 20/1,decode ctx 20/1,decode ctx 20/3,") << out;
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

// Each decode context gets a row per batch, in the order given.
TEST(BenchEngineTest, ContextFlagAddsDecodeRowsPerContext) {
  int status = -1;
  const std::string out = RunShell(
      testing::BinaryPath("src/cli/pdserve") + " bench engine --model " + testing::TinyModelDir() +
          " --batch 2 --context 8,30 --prompt-len 20 --decode-steps 2 --repeats 1 "
          "--threads 1 --kernels generic 2>&1",
      &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_EQ(TableRows(out, "generic"), "prefill 20/1,decode ctx 8/2,decode ctx 30/2,") << out;
}

TEST(BenchEngineTest, BadContextListIsAClearError) {
  for (const char* contexts : {"8,x", "0", "100000000"}) {
    int status = -1;
    const std::string out = RunShell(BenchCommand("", contexts), &status);
    EXPECT_NE(status, 0) << contexts;
    EXPECT_NE(out.find("context"), std::string::npos) << out;
  }
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
