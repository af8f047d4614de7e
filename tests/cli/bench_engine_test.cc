// `pdserve bench engine` on the tiny synthetic model: it runs, and prints one table row per
// phase (decode: per context and batch) with a ratio to its ceiling. (Speed itself is not tested;
// this keeps the benchmark from rotting.)
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "common/clock.h"
#include "testing/processes.h"
#include "testing/test_models.h"

namespace pdserve {
namespace {

constexpr int kTimeoutMs = 300'000;

// `pdserve bench engine` on the tiny model at batches 1 and 3, with `extra` flags.
testing::CommandRun RunBench(const std::vector<std::string>& extra,
                             const std::string& contexts = "20") {
  std::vector<std::string> args{"bench",        "engine", "--model",        testing::TinyModelDir(),
                                "--batch",      "1,3",    "--context",      contexts,
                                "--prompt-len", "20",     "--decode-steps", "2",
                                "--repeats",    "2",      "--threads",      "1"};
  args.insert(args.end(), extra.begin(), extra.end());
  return testing::RunPdserve(args, Deadline::AfterMs(kTimeoutMs));
}

// Every row of the table as "phase/batch" ("prefill 20/1,decode ctx 20/1,..."), each checked
// to name `path` and to carry a ratio and its bound, and a decode row its ratio to the bandwidth
// ceiling alone: never above the ratio to the lower of the two ceilings, and equal to it where
// the bandwidth binds.
std::string TableRows(const std::string& out, const std::string& path) {
  const std::regex row(
      R"(\| (prefill \d+|decode ctx \d+) \| ([a-z0-9]+) \| (bf16|f32|fp8|int8) \| (\d+) \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ (GFLOP/s|GB/s) \| [0-9.]+ \| (\d+)% \| (bandwidth|GEMM) \| (-|\d+%) \|)");
  std::string rows;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), row); it != std::sregex_iterator();
       ++it) {
    const std::smatch& m = *it;
    EXPECT_EQ(m[2].str(), path) << out;
    const std::string of_bandwidth = m[8].str();
    if (m[1].str().starts_with("prefill")) {
      EXPECT_EQ(of_bandwidth, "-") << m[0];
    } else {
      EXPECT_NE(of_bandwidth, "-") << m[0];
      if (of_bandwidth == "-") continue;
      const int bandwidth_pct = std::stoi(of_bandwidth), pct = std::stoi(m[6].str());
      EXPECT_LE(bandwidth_pct, pct) << m[0];
      if (m[7].str() == "bandwidth") {
        EXPECT_EQ(bandwidth_pct, pct) << m[0];
      }
    }
    rows += m[1].str() + "/" + m[4].str() + ",";
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
  const testing::CommandRun run = RunBench({});
  const std::string& out = run.output;
  ASSERT_TRUE(run.finished && run.exit.success()) << run.exit.ToString() << "\n" << out;
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
  const testing::CommandRun run = RunBench({"--kernels", "generic"});
  ASSERT_TRUE(run.finished && run.exit.success()) << run.exit.ToString() << "\n" << run.output;
  ExpectTable(run.output, "generic");
  const testing::CommandRun bad = RunBench({"--kernels", "sse9"});
  EXPECT_TRUE(bad.finished && bad.exit.exited() && bad.exit.code != 0) << bad.exit.ToString();
  EXPECT_NE(bad.output.find("sse9"), std::string::npos) << bad.output;
}

// The format and bytes `pattern` captures ([1] format, [2] bytes) in the weights line.
std::pair<double, std::string> FormatAndBytes(const std::string& out, const char* pattern) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex(pattern))) return {0.0, ""};
  return {std::stod(m[2].str()), m[1].str()};
}

// The bytes of weights a dense decode step reads, and the format the table rows name.
std::pair<double, std::string> WeightsRead(const std::string& out) {
  return FormatAndBytes(out, R"(weights: linear layers in ([a-z0-9]+), ([0-9]+) bytes)");
}

// The output matrix's format and bytes, as the weights line reports them.
std::pair<double, std::string> HeadRead(const std::string& out) {
  return FormatAndBytes(out, R"(; lm_head in ([a-z0-9]+), ([0-9]+) bytes of them)");
}

// --weights quantises at load: the rows name the format, the step reads about half the bytes of
// the BF16 checkpoint as it is (which the decode ceilings follow), and fp8 and int8 read about
// alike.
TEST(BenchEngineTest, WeightsFlagSetsTheFormatAndTheBytesAStepReads) {
  const testing::CommandRun bf16 = RunBench({});
  const testing::CommandRun int8 = RunBench({"--weights", "int8"});
  const testing::CommandRun fp8 = RunBench({"--weights", "fp8"});
  for (const testing::CommandRun* run : {&bf16, &int8, &fp8}) {
    ASSERT_TRUE(run->finished && run->exit.success()) << run->exit.ToString() << run->output;
  }
  const auto [bf16_bytes, bf16_format] = WeightsRead(bf16.output);
  const auto [int8_bytes, int8_format] = WeightsRead(int8.output);
  const auto [fp8_bytes, fp8_format] = WeightsRead(fp8.output);
  EXPECT_EQ(bf16_format, "bf16") << bf16.output;
  EXPECT_EQ(int8_format, "int8") << int8.output;
  EXPECT_EQ(fp8_format, "fp8") << fp8.output;
  EXPECT_GT(bf16_bytes, 0.0) << bf16.output;
  EXPECT_LT(int8_bytes, 0.7 * bf16_bytes) << int8.output;
  // The two 8-bit layouts read the same bytes: a byte a weight and a scale per column and
  // 128-wide k block (kernels.md).
  EXPECT_EQ(int8_bytes, fp8_bytes);
  EXPECT_NE(int8.output.find(" | int8 | 3 | "), std::string::npos) << int8.output;
}

// The lm_head follows --weights into INT8 (one byte a weight plus 4 per 128) unless --lm-head
// bf16 keeps it, and the bytes a step reads drop by exactly what the head saves.
TEST(BenchEngineTest, LmHeadIsInt8WithEightBitWeightsUnlessKeptBf16) {
  const testing::CommandRun bf16 = RunBench({});
  const testing::CommandRun int8 = RunBench({"--weights", "int8"});
  const testing::CommandRun kept = RunBench({"--weights", "int8", "--lm-head", "bf16"});
  for (const testing::CommandRun* run : {&bf16, &int8, &kept}) {
    ASSERT_TRUE(run->finished && run->exit.success()) << run->exit.ToString() << run->output;
  }
  const auto [bf16_head, bf16_head_format] = HeadRead(bf16.output);
  const auto [int8_head, int8_head_format] = HeadRead(int8.output);
  const auto [kept_head, kept_head_format] = HeadRead(kept.output);
  EXPECT_EQ(bf16_head_format, "bf16") << bf16.output;
  EXPECT_EQ(int8_head_format, "int8") << int8.output;
  EXPECT_EQ(kept_head_format, "bf16") << kept.output;
  EXPECT_EQ(kept_head, bf16_head);
  EXPECT_GT(int8_head, 0.5 * bf16_head) << int8.output;
  EXPECT_LT(int8_head, 0.55 * bf16_head) << int8.output;
  EXPECT_EQ(WeightsRead(kept.output).first - WeightsRead(int8.output).first, kept_head - int8_head);
}

// Each decode context gets a row per batch, in the order given.
TEST(BenchEngineTest, ContextFlagAddsDecodeRowsPerContext) {
  const testing::CommandRun run =
      testing::RunPdserve({"bench", "engine", "--model", testing::TinyModelDir(), "--batch", "2",
                           "--context", "8,30", "--prompt-len", "20", "--decode-steps", "2",
                           "--repeats", "1", "--threads", "1", "--kernels", "generic"},
                          Deadline::AfterMs(kTimeoutMs));
  ASSERT_TRUE(run.finished && run.exit.success()) << run.exit.ToString() << "\n" << run.output;
  EXPECT_EQ(TableRows(run.output, "generic"), "prefill 20/1,decode ctx 8/2,decode ctx 30/2,")
      << run.output;
}

TEST(BenchEngineTest, BadContextListIsAClearError) {
  for (const char* contexts : {"8,x", "0", "100000000"}) {
    const testing::CommandRun run = RunBench({}, contexts);
    EXPECT_TRUE(run.finished && run.exit.exited() && run.exit.code != 0)
        << contexts << ": " << run.exit.ToString();
    EXPECT_NE(run.output.find("context"), std::string::npos) << run.output;
  }
}

TEST(BenchEngineTest, BadBatchListIsAClearError) {
  const testing::CommandRun run =
      testing::RunPdserve({"bench", "engine", "--model", testing::TinyModelDir(), "--batch", "1,x"},
                          Deadline::AfterMs(kTimeoutMs));
  EXPECT_TRUE(run.finished && run.exit.exited() && run.exit.code != 0) << run.exit.ToString();
  EXPECT_NE(run.output.find("--batch"), std::string::npos) << run.output;
}

}  // namespace
}  // namespace pdserve
