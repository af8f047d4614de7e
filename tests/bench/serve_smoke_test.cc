// `pdserve bench serve` (the real binary) against a real `pdserve serve --role colocated` on
// the tiny test model: a handful of prompts, the JSON result file parsed and checked.
#include <algorithm>
#include <fstream>
#include <vector>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "testing/node_process.h"
#include "testing/test_paths.h"

namespace pdserve {
namespace {

using nlohmann::json;

TEST(BenchServeSmokeTest, RandomDatasetAgainstAColocatedNode) {
  testing::NodeProcess node(testing::TinyModelDir(), {"--role", "colocated"});
  ASSERT_TRUE(node.ok()) << node.error();
  auto models = node.Client().Get("/v1/models");
  ASSERT_TRUE(models && models->status == 200);
  const std::string model = json::parse(models->body)["data"][0]["id"];

  const std::string result_file = testing::MakeTempDir("bench_serve_smoke") + "/result.json";
  const int prompts = 4, input_len = 24, output_len = 6;
  int exit_code = -1;
  const std::string out = testing::RunPdserve({"bench",
                                               "serve",
                                               "--base-url",
                                               "http://127.0.0.1:" + std::to_string(node.port()),
                                               "--model",
                                               model,
                                               "--dataset",
                                               "random",
                                               "--random-input-len",
                                               std::to_string(input_len),
                                               "--random-output-len",
                                               std::to_string(output_len),
                                               "--num-prompts",
                                               std::to_string(prompts),
                                               "--num-warmups",
                                               "1",
                                               "--request-rate",
                                               "50",
                                               "--seed",
                                               "1",
                                               "--max-concurrency",
                                               "2",
                                               "--goodput",
                                               "e2el:60000",
                                               "--result-file",
                                               result_file},
                                              &exit_code);
  ASSERT_EQ(exit_code, 0) << out;
  EXPECT_NE(out.find("Serving Benchmark Result"), std::string::npos) << out;

  std::ifstream in(result_file);
  ASSERT_TRUE(in) << "no result file; stdout: " << out;
  const json j = json::parse(in);
  EXPECT_EQ(j["completed"], prompts);
  EXPECT_EQ(j["failed"], 0);
  EXPECT_EQ(j["num_prompts"], prompts);
  // Prompts of exact token counts (the server's /tokenize), outputs of exact length
  // (ignore_eos with max_tokens).
  EXPECT_EQ(j["input_lens"], json(std::vector<int>(prompts, input_len)));
  EXPECT_EQ(j["output_lens"], json(std::vector<int>(prompts, output_len)));
  EXPECT_EQ(j["total_output_tokens"], prompts * output_len);
  const double duration = j["duration"];
  EXPECT_DOUBLE_EQ(j["request_goodput"].get<double>(), prompts / duration);
  EXPECT_GT(j["mean_ttft_ms"].get<double>(), 0);
  // The ITL percentile agrees with the gaps the result file lists (in seconds): between their
  // median and their largest. Not "above zero": on a quiet host the tiny model's chunks can all
  // arrive in one read, each gap 0 (failed one CI run).
  std::vector<double> gaps_ms;
  for (const json& itls : j["itls"]) {
    for (const json& gap : itls) gaps_ms.push_back(1000 * gap.get<double>());
  }
  ASSERT_FALSE(gaps_ms.empty());
  std::sort(gaps_ms.begin(), gaps_ms.end());
  const double p99_itl = j["p99_itl_ms"].get<double>();
  EXPECT_GE(p99_itl, gaps_ms[(gaps_ms.size() - 1) / 2] - 1e-9);
  EXPECT_LE(p99_itl, gaps_ms.back() + 1e-9);
  EXPECT_GE(j["mean_e2el_ms"].get<double>(), j["mean_ttft_ms"].get<double>());
  // One gap per content chunk after the first; a chunk may hold several tokens (the server
  // holds back a partial UTF-8 character until the token that completes it).
  for (const json& itls : j["itls"]) {
    EXPECT_GE(itls.size(), 1u);
    EXPECT_LE(itls.size(), static_cast<size_t>(output_len - 1));
  }
}

}  // namespace
}  // namespace pdserve
