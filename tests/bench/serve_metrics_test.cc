// The load generator's pure parts: arrival times (statistical tests with fixed seeds) and the
// metric formulas on hand-made outcomes.
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "bench/serve_arrivals.h"
#include "bench/serve_metrics.h"

namespace pdserve::bench {
namespace {

double SampleMean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return sum / static_cast<double>(v.size());
}

double SampleVariance(const std::vector<double>& v) {
  const double mean = SampleMean(v);
  double sum = 0;
  for (double x : v) sum += (x - mean) * (x - mean);
  return sum / static_cast<double>(v.size() - 1);
}

// Kolmogorov–Smirnov statistic of `v` against the exponential distribution of `rate`.
double KsAgainstExponential(std::vector<double> v, double rate) {
  std::sort(v.begin(), v.end());
  const double n = static_cast<double>(v.size());
  double d = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    const double cdf = 1 - std::exp(-rate * v[i]);
    d = std::max({d, (static_cast<double>(i) + 1) / n - cdf, cdf - static_cast<double>(i) / n});
  }
  return d;
}

constexpr int kSamples = 20000;
// The KS critical value at alpha = 0.001 for large n: 1.949 / sqrt(n).
const double kKsCritical = 1.949 / std::sqrt(static_cast<double>(kSamples));

TEST(ServeArrivalsTest, PoissonGapsAreExponentialWithTheRequestedMean) {
  const double rate = 10;
  const std::vector<double> gaps = InterArrivalGaps(kSamples, {rate, 1.0, /*seed=*/7});
  ASSERT_EQ(gaps.size(), static_cast<size_t>(kSamples));
  EXPECT_LT(KsAgainstExponential(gaps, rate), kKsCritical);
  EXPECT_NEAR(SampleMean(gaps), 1 / rate, 0.02 / rate);  // sd of the mean: 0.7 %
  // A wrong rate must be caught by the same test.
  EXPECT_GT(KsAgainstExponential(gaps, rate * 1.1), kKsCritical);
}

TEST(ServeArrivalsTest, BurstinessSetsTheGammaShapeAndKeepsTheMean) {
  const double rate = 4;
  for (double k : {0.5, 4.0}) {
    const std::vector<double> gaps = InterArrivalGaps(kSamples, {rate, k, /*seed=*/11});
    EXPECT_NEAR(SampleMean(gaps), 1 / rate, 0.03 / rate) << "burstiness " << k;
    // Gamma(k, 1/(rate k)): variance 1 / (rate^2 k).
    const double variance = 1 / (rate * rate * k);
    EXPECT_NEAR(SampleVariance(gaps), variance, 0.1 * variance) << "burstiness " << k;
    EXPECT_GT(KsAgainstExponential(gaps, rate), kKsCritical) << "burstiness " << k;
  }
}

TEST(ServeArrivalsTest, SeedsReproduceAndInfiniteRateSendsAtOnce) {
  EXPECT_EQ(InterArrivalGaps(50, {3, 1, 5}), InterArrivalGaps(50, {3, 1, 5}));
  EXPECT_NE(InterArrivalGaps(50, {3, 1, 5}), InterArrivalGaps(50, {3, 1, 6}));
  const std::vector<double> times = ArrivalTimes(50, {3, 1, 5});
  const std::vector<double> gaps = InterArrivalGaps(50, {3, 1, 5});
  EXPECT_NEAR(times.back(), SampleMean(gaps) * 50, 1e-9);
  EXPECT_TRUE(std::is_sorted(times.begin(), times.end()));
  const double inf = std::numeric_limits<double>::infinity();
  for (double t : ArrivalTimes(20, {inf, 1, 0})) EXPECT_EQ(t, 0.0);
  EXPECT_FALSE(ValidateArrivals({0, 1, 0}).ok());
  EXPECT_FALSE(ValidateArrivals({1, 0, 0}).ok());
  EXPECT_FALSE(ValidateArrivals({1, inf, 0}).ok());
}

TEST(ServeMetricsTest, StatisticsFollowNumpyDefinitions) {
  const std::vector<double> v = {4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(Mean(v), 2.5);
  EXPECT_DOUBLE_EQ(Median(v), 2.5);
  EXPECT_DOUBLE_EQ(PopulationStd(v), std::sqrt(1.25));
  // Linear interpolation: rank p/100 * (n - 1) into the sorted values 1, 2, 3, 4.
  EXPECT_DOUBLE_EQ(Percentile(v, 90), 3 + 0.7 * (4 - 3));
  EXPECT_DOUBLE_EQ(Percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(Percentile(v, 100), 4);
  EXPECT_DOUBLE_EQ(Percentile({7}, 99), 7);
  EXPECT_EQ(Mean({}), 0);
  EXPECT_EQ(Percentile({}, 50), 0);
}

RequestOutcome Success(int prompt_len, int tokens, double ttft, std::vector<double> itls) {
  RequestOutcome o;
  o.success = true;
  o.prompt_len = prompt_len;
  o.output_tokens = tokens;
  o.ttft_s = ttft;
  o.itls_s = std::move(itls);
  o.e2el_s = ttft;
  for (double g : o.itls_s) o.e2el_s += g;
  return o;
}

TEST(ServeMetricsTest, EveryMetricFromHandMadeOutcomes) {
  std::vector<RequestOutcome> outcomes = {
      Success(100, 5, 0.030, {0.020, 0.020, 0.020}),  // a chunk carried two tokens
      Success(200, 3, 0.120, {0.010, 0.010}),
      Success(50, 1, 0.040, {}),  // one token: no TPOT, counts as TPOT 0 for goodput
  };
  RequestOutcome failed;
  failed.prompt_len = 70;
  failed.error = "HTTP 500";
  outcomes.push_back(failed);
  const double duration = 2.0;
  const GoodputSlo slo = *ParseGoodput({"ttft:100", "tpot:12"});
  const ServeMetrics m = ComputeServeMetrics(outcomes, duration, {50, 99}, slo);
  EXPECT_EQ(m.completed, 3);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.total_input, 350);  // failed requests' prompts do not count
  EXPECT_EQ(m.total_output, 9);
  EXPECT_DOUBLE_EQ(m.request_throughput, 3 / duration);
  EXPECT_DOUBLE_EQ(m.output_throughput, 9 / duration);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 359 / duration);
  // Goodput: #1 TPOT 15 ms > 12; #2 TTFT 120 ms > 100; #3 meets both (TPOT 0).
  EXPECT_DOUBLE_EQ(m.request_goodput, 1 / duration);
  EXPECT_DOUBLE_EQ(m.ttft.mean_ms, (30.0 + 120 + 40) / 3);
  EXPECT_DOUBLE_EQ(m.ttft.median_ms, 40);
  const std::vector<double> tpots = {0.060 / 4, 0.020 / 2};
  EXPECT_NEAR(m.tpot.mean_ms, Mean(tpots) * 1000, 1e-9);
  EXPECT_NEAR(m.tpot.std_ms, PopulationStd(tpots) * 1000, 1e-9);
  EXPECT_NEAR(m.itl.mean_ms, (3 * 20.0 + 2 * 10) / 5, 1e-9);
  EXPECT_NEAR(m.e2el.percentiles_ms[1].second, Percentile({0.090, 0.140, 0.040}, 99) * 1000, 1e-9);
  EXPECT_EQ(m.e2el.percentiles_ms[1].first, 99);

  const nlohmann::json j = MetricsToJson(m, outcomes, {"ttft", "itl"}, slo.any());
  EXPECT_EQ(j["completed"], 3);
  EXPECT_EQ(j["failed"], 1);
  EXPECT_EQ(j["total_input_tokens"], 350);
  EXPECT_EQ(j["output_lens"], nlohmann::json({5, 3, 1, 0}));
  EXPECT_EQ(j["input_lens"], nlohmann::json({100, 200, 50, 70}));
  EXPECT_EQ(j["errors"][3], "HTTP 500");
  EXPECT_EQ(j["ttfts"][3], 0.0);
  EXPECT_TRUE(j.contains("p99_ttft_ms"));
  EXPECT_TRUE(j.contains("p50_itl_ms"));
  EXPECT_FALSE(j.contains("mean_tpot_ms"));  // not among the selected metrics
  EXPECT_DOUBLE_EQ(j["request_goodput"].get<double>(), 1 / duration);
  EXPECT_TRUE(MetricsToJson(m, outcomes, {}, false)["request_goodput"].is_null());

  // The ITL SLO bounds each request's largest gap: #1's gaps are 20 ms, #2's 10, #3 has none.
  EXPECT_DOUBLE_EQ(
      ComputeServeMetrics(outcomes, duration, {50}, *ParseGoodput({"itl:15"})).request_goodput,
      2 / duration);
  EXPECT_DOUBLE_EQ(
      ComputeServeMetrics(outcomes, duration, {50}, *ParseGoodput({"itl:20"})).request_goodput,
      3 / duration);
}

TEST(ServeMetricsTest, GoodputFlagsAreCheckedLoudly) {
  EXPECT_FALSE(ParseGoodput({"ttft"}).ok());
  EXPECT_FALSE(ParseGoodput({"ttft:abc"}).ok());
  EXPECT_FALSE(ParseGoodput({"itl5"}).ok());
  EXPECT_FALSE(ParseGoodput({"tbt:5"}).ok());
  EXPECT_FALSE(ParseGoodput({"tpot:-1"}).ok());
  const auto slo = ParseGoodput({"e2el:2500.5"});
  ASSERT_TRUE(slo.ok());
  EXPECT_DOUBLE_EQ(*slo->e2el_ms, 2500.5);
  EXPECT_FALSE(slo->ttft_ms.has_value());
}

// The speculative-decoding counters as vLLM exposes them (one sample per engine, labelled) and
// as pdserve does (unlabelled): summed over labels, positions by their label, and the run's
// figures as vLLM defines them from the differences.
TEST(ServeSpecMetricsTest, CountersParsedSummedAndDiffedAsVllmDefinesThem) {
  const std::string vllm_text =
      "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.\n"
      "# TYPE vllm:spec_decode_num_drafts_total counter\n"
      "vllm:spec_decode_num_drafts_total{engine=\"0\",model_name=\"m\"} 10.0\n"
      "vllm:spec_decode_num_drafts_total{engine=\"1\",model_name=\"m\"} 30.0\n"
      "vllm:spec_decode_num_draft_tokens_total{engine=\"0\",model_name=\"m\"} 120.0\n"
      "vllm:spec_decode_num_accepted_tokens_total{engine=\"0\",model_name=\"m\"} 70.0\n"
      "vllm:spec_decode_num_accepted_tokens_per_pos_total{engine=\"0\",model_name=\"m\","
      "position=\"0\"} 35.0\n"
      "vllm:spec_decode_num_accepted_tokens_per_pos_total{engine=\"0\",model_name=\"m\","
      "position=\"2\"} 15.0\n"
      "vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"1\",engine=\"0\"} 2e1\n"
      "vllm:num_requests_running{engine=\"0\"} 3\n";
  const std::optional<SpecDecodeCounters> c = ParseSpecDecodeCounters(vllm_text);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->drafts, 40);
  EXPECT_EQ(c->draft_tokens, 120);
  EXPECT_EQ(c->accepted_tokens, 70);
  EXPECT_EQ(c->accepted_per_position, (std::vector<double>{35, 20, 15}));
  EXPECT_EQ(SumOfSamples(vllm_text, "vllm:num_requests_running"), 3);
  EXPECT_EQ(SumOfSamples(vllm_text, "vllm:num_requests_waiting"), std::nullopt);

  // A node that does not speculate has no counters: nothing to report.
  EXPECT_FALSE(ParseSpecDecodeCounters("pdserve:kv_pages_used 0\n"
                                       "# vllm:spec_decode_num_drafts_total 3\n")
                   .has_value());

  SpecDecodeCounters before;
  before.drafts = 10;
  before.draft_tokens = 30;
  before.accepted_tokens = 20;
  before.accepted_per_position = {9, 7};
  SpecDecodeAcceptance a = SpecAcceptanceBetween(before, *c);
  EXPECT_EQ(a.drafts, 30);
  EXPECT_EQ(a.draft_tokens, 90);
  EXPECT_EQ(a.accepted_tokens, 50);
  EXPECT_EQ(a.accepted_per_position, (std::vector<int64_t>{26, 13, 15}));
  EXPECT_DOUBLE_EQ(a.acceptance_rate, 50.0 / 90);
  EXPECT_DOUBLE_EQ(a.acceptance_length, 1 + 50.0 / 30);
  ASSERT_EQ(a.per_position_rates.size(), 3u);
  EXPECT_DOUBLE_EQ(a.per_position_rates[1], 13.0 / 30);

  // Two nodes (the decode nodes behind a router) add up.
  SpecDecodeCounters sum = before;
  AddSpecDecodeCounters(sum, *c);
  EXPECT_EQ(sum.drafts, 50);
  EXPECT_EQ(sum.accepted_per_position, (std::vector<double>{44, 27, 15}));

  ServeMetrics m;
  m.spec = a;
  const nlohmann::json j = MetricsToJson(m, {}, {}, false);
  EXPECT_EQ(j["spec_decode_num_drafts"], 30);
  EXPECT_EQ(j["spec_decode_draft_tokens"], 90);
  EXPECT_EQ(j["spec_decode_accepted_tokens"], 50);
  EXPECT_DOUBLE_EQ(j["spec_decode_acceptance_rate"].get<double>(), 100 * 50.0 / 90);
  EXPECT_DOUBLE_EQ(j["spec_decode_acceptance_length"].get<double>(), 1 + 50.0 / 30);
  EXPECT_EQ(j["spec_decode_per_position_acceptance_rates"].size(), 3u);
  const std::string table = FormatMetricsTable(m, {}, false);
  EXPECT_NE(table.find("Speculative Decoding"), std::string::npos) << table;
  EXPECT_NE(table.find("Acceptance rate (%):                     55.56"), std::string::npos)
      << table;
  EXPECT_NE(table.find("Acceptance length:                       2.67"), std::string::npos)
      << table;
  EXPECT_NE(table.find("86.67, 43.33, 50.00"), std::string::npos) << table;

  // A run that drafted nothing: counts of 0, ratios undefined (null, "n/a"), not 0 or NaN.
  m.spec = SpecAcceptanceBetween(*c, *c);
  const nlohmann::json idle = MetricsToJson(m, {}, {}, false);
  EXPECT_EQ(idle["spec_decode_num_drafts"], 0);
  EXPECT_TRUE(idle["spec_decode_acceptance_rate"].is_null());
  EXPECT_TRUE(idle["spec_decode_acceptance_length"].is_null());
  EXPECT_NE(FormatMetricsTable(m, {}, false).find("n/a"), std::string::npos);

  // Without speculation: no such fields, no such part of the table.
  m.spec.reset();
  EXPECT_FALSE(MetricsToJson(m, {}, {}, false).contains("spec_decode_acceptance_rate"));
  EXPECT_EQ(FormatMetricsTable(m, {}, false).find("Speculative"), std::string::npos);
}

TEST(ServeCacheMetricsTest, CountersParsedDiffedPerNodeAndSummed) {
  // A prefill node (its own cache, bytes sent) and a decode node (its cache, bytes received
  // and not transferred), Prometheus text as the nodes write it.
  const std::string p_before =
      "# TYPE vllm:prefix_cache_queries_total counter\n"
      "vllm:prefix_cache_queries_total 1000\n"
      "vllm:prefix_cache_hits_total 200\n"
      "pdserve:messenger_kv_bytes_sent_total 4096\n";
  const std::string p_after =
      "vllm:prefix_cache_queries_total 3000\n"
      "vllm:prefix_cache_hits_total 1700\n"
      "pdserve:messenger_kv_bytes_sent_total 10240\n";
  const std::string d_before =
      "vllm:prefix_cache_queries_total{engine=\"0\"} 10\n"
      "vllm:prefix_cache_hits_total{engine=\"0\"} 0\n"
      "pdserve:messenger_kv_bytes_received_total 4096\n"
      "pdserve:messenger_kv_pages_not_transferred_total 1\n"
      "pdserve:messenger_kv_bytes_not_transferred_total 1024\n";
  const std::string d_after =
      "vllm:prefix_cache_queries_total{engine=\"0\"} 2010\n"
      "vllm:prefix_cache_hits_total{engine=\"0\"} 1000\n"
      "pdserve:messenger_kv_bytes_received_total 10240\n"
      "pdserve:messenger_kv_pages_not_transferred_total 9\n"
      "pdserve:messenger_kv_bytes_not_transferred_total 9216\n";
  CacheUsage p = CacheUsageBetween(ParseCacheCounters(p_before), ParseCacheCounters(p_after));
  p.server = "http://p";
  CacheUsage d = CacheUsageBetween(ParseCacheCounters(d_before), ParseCacheCounters(d_after));
  d.server = "http://d";
  EXPECT_EQ(p.queries, 2000);
  EXPECT_EQ(p.hits, 1500);
  EXPECT_DOUBLE_EQ(p.hit_rate(), 0.75);
  EXPECT_EQ(p.kv_bytes_sent, 6144);
  EXPECT_FALSE(p.kv_bytes_received.has_value());  // a prefill node receives nothing
  EXPECT_EQ(d.kv_bytes_received, 6144);
  EXPECT_EQ(d.kv_pages_not_transferred, 8);
  EXPECT_EQ(d.kv_bytes_not_transferred, 8192);
  const CacheUsage sum = SumCacheUsage({p, d});
  EXPECT_EQ(sum.queries, 4000);
  EXPECT_EQ(sum.hits, 2500);
  EXPECT_EQ(sum.kv_bytes_sent, 6144);
  EXPECT_EQ(sum.kv_bytes_not_transferred, 8192);

  ServeMetrics m;
  m.cache = sum;
  m.cache_by_server = {p, d};
  const nlohmann::json j = MetricsToJson(m, {}, {}, false);
  EXPECT_EQ(j["prefix_cache_queries"], 4000);
  EXPECT_EQ(j["prefix_cache_hits"], 2500);
  EXPECT_DOUBLE_EQ(j["prefix_cache_hit_rate"].get<double>(), 62.5);
  EXPECT_EQ(j["kv_bytes_sent"], 6144);
  EXPECT_EQ(j["kv_bytes_received"], 6144);
  EXPECT_EQ(j["kv_pages_not_transferred"], 8);
  EXPECT_EQ(j["kv_bytes_not_transferred"], 8192);
  ASSERT_EQ(j["cache_by_server"].size(), 2u);
  EXPECT_EQ(j["cache_by_server"][0]["server"], "http://p");
  EXPECT_DOUBLE_EQ(j["cache_by_server"][0]["prefix_cache_hit_rate"].get<double>(), 75);
  EXPECT_FALSE(j["cache_by_server"][0].contains("kv_bytes_received"));
  const std::string table = FormatMetricsTable(m, {}, false);
  EXPECT_NE(table.find("Prefix cache hit rate (%):               62.50"), std::string::npos)
      << table;
  EXPECT_NE(table.find("KV bytes not transferred (D's hits):     8192"), std::string::npos)
      << table;

  // A node without those counters gives nothing; one that queried nothing has no rate.
  EXPECT_FALSE(ParseCacheCounters("pdserve:kv_pages_used 0\n").any());
  EXPECT_TRUE(std::isnan(
      CacheUsageBetween(ParseCacheCounters(p_before), ParseCacheCounters(p_before)).hit_rate()));
  m.cache = CacheUsageBetween(ParseCacheCounters(p_before), ParseCacheCounters(p_before));
  EXPECT_TRUE(MetricsToJson(m, {}, {}, false)["prefix_cache_hit_rate"].is_null());
  m.cache.reset();
  EXPECT_FALSE(MetricsToJson(m, {}, {}, false).contains("prefix_cache_hits"));
  EXPECT_EQ(FormatMetricsTable(m, {}, false).find("Prefix Caching"), std::string::npos);
}

}  // namespace
}  // namespace pdserve::bench
