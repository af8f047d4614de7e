// `pdserve bench serve` (the real binary) against a real `pdserve serve --role colocated` on
// the tiny test model: a handful of prompts, the JSON result file parsed and checked; against a
// node with a draft model, the run's speculative-decoding acceptance is the node's counters'
// differences over the run; the shared-prefix and multi-turn datasets have exact token counts
// and share their prefixes token for token, and a real node's prefix-cache hits over a
// multi-turn run are its counters' differences.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "bench/serve_dataset.h"
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
  // The node does not speculate: no acceptance reported.
  EXPECT_FALSE(j.contains("spec_decode_acceptance_rate")) << j.dump();
  EXPECT_EQ(out.find("Speculative Decoding"), std::string::npos) << out;
}

// The node's /metrics once it runs no request (it publishes its counters with the step that
// finishes a request, which may follow the request's last chunk).
std::string IdleNodeMetrics(const testing::NodeProcess& node) {
  std::string text;
  for (int i = 0; i < 400; ++i) {
    auto res = node.Client().Get("/metrics");
    if (res && res->status == 200) {
      text = res->body;
      if (testing::MetricValue(text, "pdserve:num_requests_running") == 0) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return text;
}

TEST(BenchServeSmokeTest, AcceptanceOfASpeculatingNodeIsItsCountersOverTheRun) {
  // The high-acceptance pair of the speculative tests: "tiny" with layers 2-3 quiet drafted by
  // its first two layers.
  const std::string target =
      testing::SyntheticModelDir("tiny", {.quiet_from_layer = 2, .quiet_scale = 0.05f});
  const std::string draft = testing::SyntheticModelDir("tiny", {.num_layers = 2});
  testing::NodeProcess node(
      target, {"--speculative", "draft", "--draft-model", draft, "--num-speculative-tokens", "3"});
  ASSERT_TRUE(node.ok()) << node.error();
  auto models = node.Client().Get("/v1/models");
  ASSERT_TRUE(models && models->status == 200);
  const std::string model = json::parse(models->body)["data"][0]["id"];
  // Traffic before the run: the node's counters do not start at zero, so only differences
  // give the run's figures.
  const json earlier = {{"model", model},
                        {"prompt", "Once upon a time"},
                        {"max_tokens", 20},
                        {"temperature", 0},
                        {"ignore_eos", true}};
  auto res = node.Client().Post("/v1/completions", earlier.dump(), "application/json");
  ASSERT_TRUE(res && res->status == 200);
  const std::string before = IdleNodeMetrics(node);
  ASSERT_GT(testing::MetricValue(before, "vllm:spec_decode_num_drafts_total"), 0) << before;

  const std::string result_file = testing::MakeTempDir("bench_serve_spec") + "/result.json";
  int exit_code = -1;
  const std::string out = testing::RunPdserve({"bench",
                                               "serve",
                                               "--base-url",
                                               "http://127.0.0.1:" + std::to_string(node.port()),
                                               "--model",
                                               model,
                                               "--random-input-len",
                                               "12",
                                               "--random-output-len",
                                               "40",
                                               "--num-prompts",
                                               "6",
                                               "--num-warmups",
                                               "0",
                                               "--max-concurrency",
                                               "3",
                                               "--seed",
                                               "3",
                                               "--result-file",
                                               result_file},
                                              &exit_code);
  ASSERT_EQ(exit_code, 0) << out;
  const std::string after = IdleNodeMetrics(node);
  std::ifstream in(result_file);
  ASSERT_TRUE(in) << "no result file; stdout: " << out;
  const json j = json::parse(in);
  ASSERT_EQ(j["completed"], 6);

  auto delta = [&](const std::string& name) {
    return testing::MetricValue(after, name) - testing::MetricValue(before, name);
  };
  const double drafts = delta("vllm:spec_decode_num_drafts_total");
  const double drafted = delta("vllm:spec_decode_num_draft_tokens_total");
  const double accepted = delta("vllm:spec_decode_num_accepted_tokens_total");
  EXPECT_EQ(j["spec_decode_num_drafts"].get<double>(), drafts) << j.dump();
  EXPECT_EQ(j["spec_decode_draft_tokens"].get<double>(), drafted);
  EXPECT_EQ(j["spec_decode_accepted_tokens"].get<double>(), accepted);
  EXPECT_DOUBLE_EQ(j["spec_decode_acceptance_rate"].get<double>(), 100 * accepted / drafted);
  EXPECT_DOUBLE_EQ(j["spec_decode_acceptance_length"].get<double>(), 1 + accepted / drafts);
  const json& per_position = j["spec_decode_per_position_acceptance_rates"];
  ASSERT_EQ(per_position.size(), 3u);
  for (int k = 0; k < 3; ++k) {
    const std::string name = "vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"" +
                             std::to_string(k) + "\"}";
    EXPECT_DOUBLE_EQ(per_position[k].get<double>(), delta(name) / drafts) << k;
  }
  // Acceptance above zero, and the run really drafted: 6 requests of 40 tokens, up to 3
  // drafted per step.
  EXPECT_GT(drafts, 6);
  EXPECT_GT(accepted, 0.5 * drafted);
  EXPECT_NE(out.find("Speculative Decoding"), std::string::npos) << out;
  EXPECT_NE(out.find("Acceptance length:"), std::string::npos) << out;
}

std::vector<int32_t> Encode(bench::PromptTokenizer& tokenizer, const std::string& text) {
  auto ids = tokenizer.Encode(text);
  EXPECT_TRUE(ids.ok()) << ids.status().ToString();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

std::vector<int32_t> Head(const std::vector<int32_t>& ids, size_t n) {
  return std::vector<int32_t>(ids.begin(),
                              ids.begin() + static_cast<ptrdiff_t>(std::min(n, ids.size())));
}

TEST(BenchServeDatasetTest, SharedPrefixAndMultiTurnPromptsHaveExactTokensAndSharedPrefixes) {
  auto tokenizer = bench::LocalPromptTokenizer(testing::TinyModelDir());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  bench::PromptTokenizer& tok = **tokenizer;

  // Shared prefix: 6 prompts over 2 prefixes of 40 tokens, suffixes of 9.
  const bench::SharedPrefixDatasetOptions shared{.num_prompts = 6,
                                                 .prefix_len = 40,
                                                 .suffix_len = 9,
                                                 .num_prefixes = 2,
                                                 .output_len = 3,
                                                 .seed = 5};
  auto prompts = bench::SharedPrefixDataset(shared, tok);
  ASSERT_TRUE(prompts.ok()) << prompts.status().ToString();
  ASSERT_EQ(prompts->size(), 6u);
  std::vector<std::vector<int32_t>> ids;
  for (const bench::SampleRequest& r : *prompts) {
    ids.push_back(Encode(tok, r.prompt));
    ASSERT_EQ(ids.back().size(), 49u) << r.prompt;
    EXPECT_EQ(r.prompt_len, 49);
    EXPECT_EQ(r.output_len, 3);
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    for (size_t k = i + 1; k < ids.size(); ++k) {
      // Prompt i has prefix i % 2: the same 40 tokens as every prompt of its prefix, different
      // ones from the other's; every suffix its own.
      EXPECT_EQ(Head(ids[i], 40) == Head(ids[k], 40), i % 2 == k % 2) << i << " " << k;
      EXPECT_NE(ids[i], ids[k]) << i << " " << k;
    }
  }

  // Multi-turn: 3 conversations of 3 turns, system prompt 33, user messages 7, answers 5.
  const bench::MultiTurnDatasetOptions multi{.num_conversations = 3,
                                             .num_turns = 3,
                                             .system_prompt_len = 33,
                                             .user_len = 7,
                                             .answer_len = 5,
                                             .output_len = 4,
                                             .seed = 9};
  auto turns = bench::MultiTurnDataset(multi, tok);
  ASSERT_TRUE(turns.ok()) << turns.status().ToString();
  ASSERT_EQ(turns->size(), 9u);
  std::vector<int32_t> first_system;
  for (int c = 0; c < 3; ++c) {
    std::vector<int32_t> previous;
    for (int t = 1; t <= 3; ++t) {
      const bench::SampleRequest& r = (*turns)[static_cast<size_t>(c * 3 + t - 1)];
      EXPECT_EQ(r.conversation, c);
      EXPECT_EQ(r.turn, t);
      EXPECT_EQ(r.output_len, 4);
      const std::vector<int32_t> turn_ids = Encode(tok, r.prompt);
      const size_t want = 33 + 7 * t + 5 * (t - 1);
      ASSERT_EQ(turn_ids.size(), want) << "conversation " << c << " turn " << t;
      EXPECT_EQ(r.prompt_len, static_cast<int>(want));
      // Turn t's tokens start with turn t-1's: the history, token for token.
      if (t > 1) {
        EXPECT_EQ(Head(turn_ids, previous.size()), previous) << c << " " << t;
        EXPECT_EQ(r.prompt.rfind((*turns)[static_cast<size_t>(c * 3 + t - 2)].prompt, 0), 0u);
      }
      // Every conversation starts with the same system prompt and then goes its own way.
      if (first_system.empty()) first_system = Head(turn_ids, 40);
      EXPECT_EQ(Head(turn_ids, 33), Head(first_system, 33)) << c;
      if (c > 0 && t == 1) {
        EXPECT_NE(Head(turn_ids, 40), first_system) << c;
      }
      previous = turn_ids;
    }
  }

  // Bad shapes are refused with the flag's name.
  bench::SharedPrefixDatasetOptions bad = shared;
  bad.num_prefixes = 7;
  auto refused = bench::SharedPrefixDataset(bad, tok);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("--num-prefixes"), std::string::npos);
}

TEST(BenchServeSmokeTest, MultiTurnHitRateIsTheNodesCountersOverTheRun) {
  testing::NodeProcess node(testing::TinyModelDir(), {"--role", "colocated"});
  ASSERT_TRUE(node.ok()) << node.error();
  auto models = node.Client().Get("/v1/models");
  ASSERT_TRUE(models && models->status == 200);
  const std::string model = json::parse(models->body)["data"][0]["id"];
  // Traffic before the run (cached, hit): only the counters' differences give the run's.
  const json earlier = {{"model", model},
                        {"prompt", "Once upon a time there was a little cat"},
                        {"max_tokens", 3},
                        {"temperature", 0}};
  for (int i = 0; i < 2; ++i) {
    auto res = node.Client().Post("/v1/completions", earlier.dump(), "application/json");
    ASSERT_TRUE(res && res->status == 200);
  }
  const std::string before = IdleNodeMetrics(node);
  ASSERT_GT(testing::MetricValue(before, "vllm:prefix_cache_queries_total"), 0) << before;

  const std::string url = "http://127.0.0.1:" + std::to_string(node.port());
  const std::string result_file = testing::MakeTempDir("bench_serve_multi_turn") + "/result.json";
  int exit_code = -1;
  const std::string out = testing::RunPdserve({"bench",
                                               "serve",
                                               "--base-url",
                                               url,
                                               "--model",
                                               model,
                                               "--dataset",
                                               "multi-turn",
                                               "--num-conversations",
                                               "3",
                                               "--num-turns",
                                               "3",
                                               "--system-prompt-len",
                                               "40",
                                               "--user-len",
                                               "8",
                                               "--answer-len",
                                               "8",
                                               "--output-len",
                                               "4",
                                               "--max-concurrency",
                                               "2",
                                               "--seed",
                                               "2",
                                               "--result-file",
                                               result_file},
                                              &exit_code);
  ASSERT_EQ(exit_code, 0) << out;
  const std::string after = IdleNodeMetrics(node);
  std::ifstream in(result_file);
  ASSERT_TRUE(in) << "no result file; stdout: " << out;
  const json j = json::parse(in);
  ASSERT_EQ(j["completed"], 9);
  for (int i = 0; i < 9; ++i) {
    const int turn = i % 3 + 1;
    EXPECT_EQ(j["turns"][i], turn);
    EXPECT_EQ(j["input_lens"][i], 40 + 8 * turn + 8 * (turn - 1));
  }
  ASSERT_EQ(j["ttft_by_turn"].size(), 3u);

  auto delta = [&](const std::string& name) {
    return testing::MetricValue(after, name) - testing::MetricValue(before, name);
  };
  const double queries = delta("vllm:prefix_cache_queries_total");
  const double hits = delta("vllm:prefix_cache_hits_total");
  EXPECT_EQ(j["prefix_cache_queries"].get<double>(), queries) << j.dump();
  EXPECT_EQ(j["prefix_cache_hits"].get<double>(), hits);
  EXPECT_DOUBLE_EQ(j["prefix_cache_hit_rate"].get<double>(), 100 * hits / queries);
  // Every prompt token is queried once, with the special tokens the server adds (the dataset
  // counts without them, as vLLM's does); later turns and other conversations hit the history
  // and the system prompt.
  auto tokens = [&](bool special) {
    const json body = {{"model", model}, {"prompt", "hello"}, {"add_special_tokens", special}};
    auto res = node.Client().Post("/tokenize", body.dump(), "application/json");
    EXPECT_TRUE(res && res->status == 200);
    return res && res->status == 200 ? json::parse(res->body)["tokens"].size() : 0u;
  };
  const double specials = static_cast<double>(tokens(true) - tokens(false));
  EXPECT_EQ(queries, j["total_input_tokens"].get<double>() + 9 * specials);
  EXPECT_GT(hits, 0);
  EXPECT_LT(hits, queries);
  ASSERT_EQ(j["cache_by_server"].size(), 1u);
  EXPECT_EQ(j["cache_by_server"][0]["server"], url);
  EXPECT_FALSE(j.contains("kv_bytes_sent"));  // a colocated node sends no KV
  EXPECT_NE(out.find("Prefix cache hit rate (%):"), std::string::npos) << out;
  EXPECT_NE(out.find("Turns 2-3 mean / median TTFT (ms):"), std::string::npos) << out;
}

}  // namespace
}  // namespace pdserve
