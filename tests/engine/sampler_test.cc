#include "engine/sampler.h"

#include <array>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "engine/sampling_params.h"

namespace pdserve {

class SamplerTestPeer {
 public:
  // The ids top-k/top-p kept in the last Sample() (valid when logprobs == 0).
  static std::vector<int32_t> KeptIds(const Sampler& s) {
    std::vector<int32_t> ids = s.candidates_;
    std::sort(ids.begin(), ids.end());
    return ids;
  }
};

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

SamplingParams Seeded(uint64_t seed) {
  SamplingParams p;
  p.seed = seed;
  return p;
}

// Logits of a fixed 4-token distribution (0.1, 0.2, 0.3, 0.4).
std::vector<float> FourTokenLogits() {
  return {std::log(0.1f), std::log(0.2f), std::log(0.3f), std::log(0.4f)};
}

std::vector<float> RandomLogits(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::array<int, 4> Histogram(Sampler& s, const std::vector<float>& logits, int draws) {
  std::array<int, 4> counts{};
  for (int i = 0; i < draws; ++i) ++counts.at(s.Sample(logits).token);
  return counts;
}

// Pearson chi-square of observed counts against expected probabilities.
double ChiSquare(const std::array<int, 4>& counts, const std::array<double, 4>& probs, int n) {
  double chi = 0.0;
  for (int i = 0; i < 4; ++i) {
    const double expected = probs[i] * n;
    chi += (counts[i] - expected) * (counts[i] - expected) / expected;
  }
  return chi;
}

// 3 degrees of freedom: P(chi2 > 16.27) = 0.001. The draws are seeded, so this is exact.
constexpr double kChiSquareLimit = 16.27;

TEST(SamplerTest, GreedyPicksArgmaxAndLowestIdOnTies) {
  SeedSource seeds(1);
  SamplingParams p;
  p.temperature = 0.0f;
  Sampler s(p, seeds);
  EXPECT_EQ(s.Sample(std::vector<float>{0.1f, 2.0f, -1.0f, 1.9f}).token, 1);
  EXPECT_EQ(s.Sample(std::vector<float>{0.0f, 3.0f, 3.0f, 3.0f}).token, 1);
  const std::vector<float> logits = RandomLogits(151936, 7);
  const auto argmax = std::max_element(logits.begin(), logits.end()) - logits.begin();
  EXPECT_EQ(s.Sample(logits).token, argmax);
}

TEST(SamplerTest, GreedyIgnoresNanAndMaskedLogits) {
  SeedSource seeds(1);
  SamplingParams p;
  p.temperature = 0.0f;
  Sampler s(p, seeds);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(s.Sample(std::vector<float>{nan, kNegInf, 0.5f, nan}).token, 2);
  // Nothing finite: no crash, the lowest id of the best logit.
  const SampleResult r = s.Sample(std::vector<float>{kNegInf, kNegInf});
  EXPECT_EQ(r.token, 0);
}

TEST(SamplerTest, SameSeedReproducesAndDifferentSeedsDiffer) {
  const std::vector<float> logits = RandomLogits(1000, 3);
  SeedSource seeds(1);
  auto run = [&](uint64_t seed) {
    Sampler s(Seeded(seed), seeds);
    std::vector<int32_t> tokens;
    for (int i = 0; i < 64; ++i) tokens.push_back(s.Sample(logits).token);
    return tokens;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
}

TEST(SamplerTest, UnseededRequestsDrawDistinctSeedsFromTheSource) {
  SeedSource a(5), b(5);
  SamplingParams p;
  Sampler s1(p, a), s2(p, a), t1(p, b);
  EXPECT_NE(s1.seed(), s2.seed());
  EXPECT_EQ(s1.seed(), t1.seed());  // the source itself is reproducible
  Sampler explicit_seed(Seeded(99), a);
  EXPECT_EQ(explicit_seed.seed(), 99u);
}

TEST(SamplerTest, TopKOneEqualsGreedy) {
  SeedSource seeds(1);
  SamplingParams p = Seeded(11);
  p.top_k = 1;
  p.temperature = 5.0f;
  Sampler s(p, seeds);
  for (int i = 0; i < 20; ++i) {
    const std::vector<float> logits = RandomLogits(5000, 100 + i);
    const auto argmax = std::max_element(logits.begin(), logits.end()) - logits.begin();
    EXPECT_EQ(s.Sample(logits).token, argmax);
  }
}

TEST(SamplerTest, TopKKeepsOnlyTheKMostLikely) {
  SeedSource seeds(1);
  SamplingParams p = Seeded(12);
  p.top_k = 2;
  p.temperature = 3.0f;  // flat enough that excluded tokens would show up
  Sampler s(p, seeds);
  const std::array<int, 4> counts = Histogram(s, FourTokenLogits(), 4000);
  EXPECT_EQ(counts[0] + counts[1], 0);
  // Renormalised over the kept pair at temperature 3: 0.3^(1/3) : 0.4^(1/3).
  const double p3 = std::cbrt(0.3), p4 = std::cbrt(0.4);
  EXPECT_LT(ChiSquare(counts, {1e-9, 1e-9, p3 / (p3 + p4), p4 / (p3 + p4)}, 4000), kChiSquareLimit);
}

TEST(SamplerTest, TinyTopPKeepsOnlyTheTopToken) {
  SeedSource seeds(1);
  SamplingParams p = Seeded(13);
  p.top_p = 1e-6f;
  p.temperature = 10.0f;
  Sampler s(p, seeds);
  const std::vector<float> logits = RandomLogits(151936, 9);
  const auto argmax = std::max_element(logits.begin(), logits.end()) - logits.begin();
  for (int i = 0; i < 5; ++i) EXPECT_EQ(s.Sample(logits).token, argmax);
  const std::array<int, 4> counts = Histogram(s, FourTokenLogits(), 500);
  EXPECT_EQ(counts[3], 500);
}

TEST(SamplerTest, TopPKeepsTheNucleus) {
  SeedSource seeds(1);
  SamplingParams p = Seeded(14);
  p.top_p = 0.5f;  // 0.4 alone is below 0.5, so 0.3 joins; 0.2 and 0.1 are cut
  Sampler s(p, seeds);
  const int n = 20000;
  const std::array<int, 4> counts = Histogram(s, FourTokenLogits(), n);
  EXPECT_EQ(counts[0] + counts[1], 0);
  EXPECT_LT(ChiSquare(counts, {1e-9, 1e-9, 3.0 / 7, 4.0 / 7}, n), kChiSquareLimit);
}

TEST(SamplerTest, TopPOverALargeVocabularyMatchesItsDefinition) {
  // A vocabulary where the nucleus needs more than the first selection window (256 ids):
  // 2000 equal logits and top_p 0.5 keep exactly the 1000 lowest ids.
  SeedSource seeds(1);
  SamplingParams p = Seeded(15);
  p.top_p = 0.5f;
  Sampler s(p, seeds);
  std::vector<float> logits(2000, 1.0f);
  int32_t highest = 0;
  for (int i = 0; i < 300; ++i) {
    const int32_t t = s.Sample(logits).token;
    ASSERT_GE(t, 0);
    ASSERT_LT(t, 1001);  // 1000 ids hold exactly 0.5; allow one for rounding of the mass
    highest = std::max(highest, t);
  }
  EXPECT_GT(highest, 500);  // the nucleus really is the 1000 ids, not a smaller window
}

// The kept set of top-k/top-p straight from the definition: sort everything (logit desc,
// id asc), cut to k, keep each id whose preceding mass is below top_p of the total.
std::vector<int32_t> ReferenceKept(const std::vector<float>& logits, float temperature, int top_k,
                                   float top_p) {
  std::vector<int32_t> order(logits.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (top_k > 0 && top_k < static_cast<int>(order.size())) order.resize(top_k);
  const double m = logits[order[0]];
  std::vector<double> w;
  double total = 0.0;
  for (int32_t id : order) {
    w.push_back(std::exp((logits[id] - m) / temperature));
    total += w.back();
  }
  std::vector<int32_t> kept;
  double before = 0.0;
  for (size_t i = 0; i < order.size() && before < top_p * total; ++i) {
    kept.push_back(order[i]);
    before += w[i];
  }
  std::sort(kept.begin(), kept.end());
  return kept;
}

TEST(SamplerTest, KeptSetMatchesTheDefinition) {
  SeedSource seeds(1);
  struct Case {
    float spread;  // standard deviation of the logits; 0 => many exact ties
    float temperature;
    int top_k;
    float top_p;
  };
  const Case cases[] = {
      {1.0f, 1.0f, 0, 0.9f},    {3.0f, 1.0f, 0, 0.5f},   {8.0f, 0.7f, 0, 0.95f},
      {3.0f, 1.5f, 0, 0.99f},   {0.0f, 1.0f, 0, 0.3f},   {3.0f, 1.0f, 40, 0.8f},
      {1.0f, 2.0f, 3000, 0.7f}, {0.5f, 1.0f, 0, 0.999f}, {3.0f, 0.3f, 0, 0.1f},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "spread " << c.spread << " temperature " << c.temperature
                                      << " top_k " << c.top_k << " top_p " << c.top_p);
    std::vector<float> logits;
    if (c.spread == 0.0f) {
      // Four levels of logits with thousands of exact ties each.
      for (int i = 0; i < 20000; ++i) logits.push_back(static_cast<float>((i * 7) % 4));
    } else {
      logits = RandomLogits(20000, 31);
      for (float& l : logits) l *= c.spread / 3.0f;
    }
    SamplingParams p = Seeded(5);
    p.temperature = c.temperature;
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    Sampler s(p, seeds);
    const int32_t token = s.Sample(logits).token;
    const std::vector<int32_t> kept = SamplerTestPeer::KeptIds(s);
    EXPECT_EQ(kept, ReferenceKept(logits, c.temperature, c.top_k, c.top_p));
    EXPECT_TRUE(std::binary_search(kept.begin(), kept.end(), token));
  }
}

TEST(SamplerTest, TopKAndTopPCombine) {
  SeedSource seeds(1);
  SamplingParams p = Seeded(16);
  p.top_k = 3;     // keeps 0.2, 0.3, 0.4 -> renormalised 2/9, 3/9, 4/9
  p.top_p = 0.6f;  // 4/9 < 0.6 so 3/9 joins; 2/9 is cut
  Sampler s(p, seeds);
  const std::array<int, 4> counts = Histogram(s, FourTokenLogits(), 5000);
  EXPECT_EQ(counts[0] + counts[1], 0);
  EXPECT_GT(counts[2], 0);
}

TEST(SamplerTest, TemperatureOneFollowsTheDistribution) {
  SeedSource seeds(1);
  Sampler s(Seeded(17), seeds);
  const int n = 20000;
  EXPECT_LT(ChiSquare(Histogram(s, FourTokenLogits(), n), {0.1, 0.2, 0.3, 0.4}, n),
            kChiSquareLimit);
}

TEST(SamplerTest, TemperatureReshapesTheDistribution) {
  const int n = 20000;
  SeedSource seeds(1);
  // Temperature 0.5 squares the probabilities: 1, 4, 9, 16 over 30.
  SamplingParams cold = Seeded(18);
  cold.temperature = 0.5f;
  Sampler s_cold(cold, seeds);
  const std::array<int, 4> cold_counts = Histogram(s_cold, FourTokenLogits(), n);
  const std::array<double, 4> squared = {1.0 / 30, 4.0 / 30, 9.0 / 30, 16.0 / 30};
  EXPECT_LT(ChiSquare(cold_counts, squared, n), kChiSquareLimit);
  // And it is clearly not the temperature-1 distribution.
  EXPECT_GT(ChiSquare(cold_counts, {0.1, 0.2, 0.3, 0.4}, n), 100.0);

  // Temperature 2 takes square roots: flatter.
  SamplingParams hot = Seeded(19);
  hot.temperature = 2.0f;
  Sampler s_hot(hot, seeds);
  std::array<double, 4> roots = {std::sqrt(0.1), std::sqrt(0.2), std::sqrt(0.3), std::sqrt(0.4)};
  const double sum = roots[0] + roots[1] + roots[2] + roots[3];
  for (double& r : roots) r /= sum;
  EXPECT_LT(ChiSquare(Histogram(s_hot, FourTokenLogits(), n), roots, n), kChiSquareLimit);
}

TEST(SamplerTest, LogprobsMatchADirectLogSoftmax) {
  SeedSource seeds(1);
  SamplingParams p = Seeded(20);
  p.logprobs = 5;
  p.temperature = 0.7f;  // logprobs stay those of the raw logits whatever the temperature
  p.top_k = 50;
  Sampler s(p, seeds);
  std::vector<float> logits = RandomLogits(32000, 21);
  logits[123] = kNegInf;  // masked logits take no mass
  double m = -1e30;
  for (float l : logits) m = std::max(m, static_cast<double>(l));
  double z = 0.0;
  for (float l : logits) z += std::exp(static_cast<double>(l) - m);
  const double log_z = m + std::log(z);

  for (int step = 0; step < 4; ++step) {
    const SampleResult r = s.Sample(logits);
    EXPECT_NEAR(r.logprob, logits[r.token] - log_z, 1e-4);
    ASSERT_EQ(r.top_logprobs.size(), 5u);
    std::vector<int32_t> order(logits.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
    std::partial_sort(order.begin(), order.begin() + 5, order.end(),
                      [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(r.top_logprobs[i].token, order[i]);
      EXPECT_NEAR(r.top_logprobs[i].logprob, logits[order[i]] - log_z, 1e-4);
    }
  }
}

TEST(SamplerTest, LogprobsOfAKnownDistribution) {
  SeedSource seeds(1);
  SamplingParams p;
  p.temperature = 0.0f;
  p.logprobs = 2;
  Sampler s(p, seeds);
  const SampleResult r = s.Sample(FourTokenLogits());
  EXPECT_EQ(r.token, 3);
  EXPECT_NEAR(r.logprob, std::log(0.4), 1e-6);
  ASSERT_EQ(r.top_logprobs.size(), 2u);
  EXPECT_EQ(r.top_logprobs[0], (TokenLogprob{3, r.logprob}));
  EXPECT_EQ(r.top_logprobs[1].token, 2);
  EXPECT_NEAR(r.top_logprobs[1].logprob, std::log(0.3), 1e-6);
  // Without the request, no alternatives.
  SamplingParams none;
  none.temperature = 0.0f;
  Sampler s2(none, seeds);
  EXPECT_TRUE(s2.Sample(FourTokenLogits()).top_logprobs.empty());
}

TEST(SamplerTest, LargeTopKUsesTheSameOrderAsSmall) {
  // top_k above the heap limit goes through nth_element; the chosen set must be the same
  // top-k, so with a tiny top_p both paths return the argmax.
  SeedSource seeds(1);
  SamplingParams p = Seeded(22);
  p.top_k = 5000;
  p.top_p = 1e-6f;
  Sampler s(p, seeds);
  const std::vector<float> logits = RandomLogits(151936, 23);
  const auto argmax = std::max_element(logits.begin(), logits.end()) - logits.begin();
  EXPECT_EQ(s.Sample(logits).token, argmax);
  // And without top_p, only ids among the 5000 largest logits are drawn.
  SamplingParams q = Seeded(24);
  q.top_k = 5000;
  q.temperature = 50.0f;
  Sampler s2(q, seeds);
  std::vector<float> sorted = logits;
  std::nth_element(sorted.begin(), sorted.begin() + 4999, sorted.end(), std::greater<float>());
  const float kth = sorted[4999];
  for (int i = 0; i < 20; ++i) EXPECT_GE(logits[s2.Sample(logits).token], kth);
}

// Speculative decoding's view of the sampler: Distribution is the processed distribution over
// exactly the kept set Sample draws from, and Describe reports what Sample would.
TEST(SamplerTest, DistributionIsWhatSampleDrawsFrom) {
  const std::vector<float> logits = RandomLogits(3000, 21);
  for (auto [top_k, top_p] : {std::pair{0, 1.0f}, {0, 0.9f}, {50, 1.0f}, {200, 0.8f}}) {
    SeedSource seeds(1);
    SamplingParams p = Seeded(31);
    p.temperature = 0.7f;
    p.top_k = top_k;
    p.top_p = top_p;
    Sampler s(p, seeds);
    std::vector<float> probs(logits.size());
    s.Distribution(logits, probs);
    double sum = 0.0;
    std::vector<int32_t> support;
    for (size_t i = 0; i < probs.size(); ++i) {
      sum += probs[i];
      if (probs[i] > 0) support.push_back(static_cast<int32_t>(i));
    }
    EXPECT_NEAR(sum, 1.0, 1e-5);
    const SampleResult drawn = s.Sample(logits);
    if (top_k > 0 || top_p < 1.0f) {
      EXPECT_EQ(support, SamplerTestPeer::KeptIds(s)) << top_k << " " << top_p;
    }
    EXPECT_GT(probs[drawn.token], 0.0f);
    const SampleResult described = s.Describe(logits, drawn.token);
    EXPECT_EQ(described.logprob, drawn.logprob);
    // Temperature 0.7: the ratio of two kept tokens' probabilities is exp(dlogit / 0.7).
    const int32_t a = support.front(), b = support.back();
    EXPECT_NEAR(std::log(probs[a] / probs[b]), (logits[a] - logits[b]) / 0.7, 1e-3);
  }
  SeedSource seeds(1);
  SamplingParams greedy = Seeded(1);
  greedy.temperature = 0;
  Sampler g(greedy, seeds);
  std::vector<float> probs(logits.size());
  g.Distribution(logits, probs);
  const auto argmax = std::max_element(logits.begin(), logits.end()) - logits.begin();
  EXPECT_EQ(probs[argmax], 1.0f);
}

TEST(SamplingParamsTest, ValidateAcceptsDefaultsAndNamesBadFields) {
  EXPECT_TRUE(SamplingParams{}.Validate(1000).ok());
  auto error_of = [](auto mutate) {
    SamplingParams p;
    mutate(p);
    const Status st = p.Validate(1000);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    return st.message();
  };
  EXPECT_NE(error_of([](SamplingParams& p) { p.temperature = -0.5f; }).find("temperature"),
            std::string::npos);
  EXPECT_NE(error_of([](SamplingParams& p) {
              p.temperature = std::numeric_limits<float>::quiet_NaN();
            }).find("temperature"),
            std::string::npos);
  EXPECT_NE(error_of([](SamplingParams& p) { p.top_p = 0.0f; }).find("top_p"), std::string::npos);
  EXPECT_NE(error_of([](SamplingParams& p) { p.top_p = 1.5f; }).find("top_p"), std::string::npos);
  EXPECT_NE(error_of([](SamplingParams& p) { p.top_k = -2; }).find("top_k"), std::string::npos);
  EXPECT_NE(error_of([](SamplingParams& p) { p.max_tokens = 0; }).find("max_tokens"),
            std::string::npos);
  EXPECT_NE(error_of([](SamplingParams& p) { p.logprobs = 21; }).find("logprobs"),
            std::string::npos);
  EXPECT_NE(error_of([](SamplingParams& p) {
              p.stop = {"ok", ""};
            }).find("stop[1]"),
            std::string::npos);
  EXPECT_NE(error_of([](SamplingParams& p) { p.stop = {"\xff"}; }).find("UTF-8"),
            std::string::npos);
  EXPECT_NE(error_of([](SamplingParams& p) {
              p.stop_token_ids = {5, 1000};
            }).find("stop_token_ids[1]"),
            std::string::npos);
  SamplingParams small;
  small.logprobs = 10;
  EXPECT_FALSE(small.Validate(5).ok());
  SamplingParams fine;
  fine.top_k = -1;
  fine.top_p = 1.0f;
  fine.stop = {"\xe2\x82\xac", "\n\n"};
  fine.stop_token_ids = {0, 999};
  fine.logprobs = 20;
  EXPECT_TRUE(fine.Validate(1000).ok());
}

}  // namespace
}  // namespace pdserve
