// `pdserve bench soak`'s machinery on a short run (the real soak is `make soak`, minutes long):
// the router and both nodes start, node B is killed and comes back, the load runs through the
// router, every request is classified, none is a violation (a stream cut when its node dies
// must end with an error event and [DONE], never silently), and both nodes are read back idle.
#include <gtest/gtest.h>

#include "bench/soak.h"
#include "testing/test_models.h"
#include "testing/test_paths.h"

namespace pdserve::bench {
namespace {

TEST(BenchSoakTest, ShortSoakKillsAndRestartsNodeBAndClassifiesEveryRequest) {
  SoakOptions options;
  options.pdserve = testing::BinaryPath("src/cli/pdserve");
  options.model_dir = testing::TinyModelDir();
  options.seconds = 6;
  options.concurrency = 2;
  options.kill_every = std::chrono::seconds(2);
  options.max_tokens = 8;
  options.log_dir = testing::MakeTempDir("bench_soak");
  auto report = RunSoak(options);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->aborted.empty()) << report->aborted;
  EXPECT_GE(report->kills, 1);
  EXPECT_EQ(report->restarts, report->kills);
  EXPECT_GT(report->completed, 0);
  int classified = report->completed;
  for (const auto& [what, n] : report->well_formed) classified += n;
  for (const auto& [what, n] : report->violations) classified += n;
  EXPECT_EQ(classified, report->requests);
  EXPECT_TRUE(report->violations.empty()) << FormatSoakReport(*report);
  ASSERT_EQ(report->nodes.size(), 2u);
  for (const SoakNodeState& node : report->nodes) {
    EXPECT_TRUE(node.idle()) << node.name << " running " << node.running << " waiting "
                             << node.waiting << " kv " << node.kv_cache_usage;
  }
  const std::string table = FormatSoakReport(*report);
  EXPECT_NE(table.find("Verdict: "), std::string::npos) << table;
}

TEST(BenchSoakTest, BadOptionsAreRefused) {
  SoakOptions options;
  EXPECT_EQ(RunSoak(options).status().code(), StatusCode::kInvalidArgument);
  options.pdserve = "pdserve";
  options.model_dir = "m";
  options.log_dir = "/tmp";
  options.concurrency = 0;
  EXPECT_EQ(RunSoak(options).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve::bench
