#include "engine/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>

#include "common/check.h"

namespace pdserve {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
// Top-k by a bounded heap (one pass, no index array) up to this k; nth_element beyond.
constexpr int kHeapSelectMaxK = 2048;

// NaN logits rank as -inf so that a broken logit can never be chosen over a real one.
inline float RankKey(float logit) { return std::isnan(logit) ? -kInf : logit; }

// The order of candidates everywhere: higher logit first, ties to the lower id, so that
// results do not depend on the selection algorithm.
inline bool Better(float key_a, int32_t a, float key_b, int32_t b) {
  return key_a > key_b || (key_a == key_b && a < b);
}

// exp(x) for x <= 0, written without calls so that loops over it vectorise; relative error
// below 1e-6. Arguments below -87 (where float exp leaves the normal range), -inf and NaN
// give 0.
inline float ExpNonPositive(float x) {
  const bool underflow = !(x >= -87.0f);
  x = underflow ? -87.0f : x;
  // Round x / ln 2 to the nearest integer by adding 1.5 * 2^23 (std::floor would be a libm
  // call that blocks vectorisation without -ffast-math).
  constexpr float kRoundMagic = 12582912.0f;
  const float n = (x * 1.44269504f + kRoundMagic) - kRoundMagic;
  // Cody-Waite split of ln 2 keeps r exact enough for the polynomial.
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  // Taylor series of e^r to degree 7; |r| <= 0.35 so the truncation error is ~5e-9.
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const float scale = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  return underflow ? 0.0f : p * scale;
}

// Sum in double with eight independent accumulators: vectorisable yet with a fixed order, so
// the result is the same on every call (reproducible sampling).
double SumFloats(const float* p, size_t n) {
  double acc[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += p[i + j];
  }
  double sum = 0.0;
  for (double a : acc) sum += a;
  for (; i < n; ++i) sum += p[i];
  return sum;
}

float MaxLogit(std::span<const float> logits) {
  // Sixteen independent lanes so that the compiler can keep them in one vector register.
  constexpr size_t kLanes = 16;
  float lanes[kLanes];
  std::fill(lanes, lanes + kLanes, -kInf);
  const float* p = logits.data();
  const size_t n = logits.size();
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      lanes[j] = p[i + j] > lanes[j] ? p[i + j] : lanes[j];  // NaN compares false: skipped
    }
  }
  float m = -kInf;
  for (float l : lanes) m = l > m ? l : m;
  for (; i < n; ++i) m = p[i] > m ? p[i] : m;
  return m;
}

// Lowest id whose logit equals `value`; 0 if none does (all NaN).
int32_t FirstIndexOf(std::span<const float> logits, float value) {
  const auto it = std::find(logits.begin(), logits.end(), value);
  return it == logits.end() ? 0 : static_cast<int32_t>(it - logits.begin());
}

// Fills w with exp((logits - max) * inv_temp) for every id; returns the sum.
double VocabWeights(std::span<const float> logits, float max_logit, float inv_temp,
                    std::vector<float>* w) {
  w->resize(logits.size());
  float* out = w->data();
  const float* in = logits.data();
  const size_t n = logits.size();
  for (size_t i = 0; i < n; ++i) out[i] = ExpNonPositive((in[i] - max_logit) * inv_temp);
  return SumFloats(out, n);
}

}  // namespace

uint64_t SeedSource::Next() {
  constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
  uint64_t z = state_.fetch_add(kGolden, std::memory_order_relaxed) + kGolden;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

Sampler::Sampler(const SamplingParams& params, SeedSource& seeds)
    : temperature_(params.temperature),
      top_k_(params.top_k),
      top_p_(params.top_p),
      num_logprobs_(params.logprobs),
      greedy_(params.greedy()),
      seed_(params.seed ? *params.seed : seeds.Next()),
      rng_(seed_) {}

double Sampler::Uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

SampleResult Sampler::Sample(std::span<const float> logits) {
  PD_CHECK(!logits.empty());
  const int vocab = static_cast<int>(logits.size());
  const float max_logit = MaxLogit(logits);
  SampleResult result;

  if (!(max_logit > -kInf && max_logit < kInf)) {
    // Degenerate logits (all masked, or +inf present): no distribution to sample from.
    result.token = FirstIndexOf(logits, max_logit);
    result.logprob = max_logit == kInf ? 0.0f : -kInf;
    FillTopLogprobs(logits, std::numeric_limits<double>::quiet_NaN(), &result);
    return result;
  }

  // Raw log-softmax normaliser; at temperature 1 its weights are also the sampling weights.
  const double raw_mass = VocabWeights(logits, max_logit, 1.0f, &vocab_weights_);
  const double log_normalizer = max_logit + std::log(raw_mass);

  if (greedy_) {
    result.token = FirstIndexOf(logits, max_logit);
  } else {
    const float inv_temp = 1.0f / temperature_;
    if (top_k_ > 0 && top_k_ < vocab) {
      SelectTopK(logits, top_k_);
      double mass = CandidateWeights(logits, max_logit, inv_temp);
      if (top_p_ < 1.0f) mass = ApplyTopP(mass);
      result.token = DrawFromCandidates(mass);
    } else {
      const double mass =
          inv_temp == 1.0f ? raw_mass : VocabWeights(logits, max_logit, inv_temp, &vocab_weights_);
      result.token =
          top_p_ < 1.0f ? DrawFromCandidates(VocabTopP(logits, mass)) : DrawFromVocab(mass);
    }
  }
  result.logprob = static_cast<float>(logits[result.token] - log_normalizer);
  FillTopLogprobs(logits, log_normalizer, &result);
  return result;
}

void Sampler::Distribution(std::span<const float> logits, std::span<float> probs) {
  PD_CHECK(!logits.empty() && probs.size() == logits.size());
  const int vocab = static_cast<int>(logits.size());
  const float max_logit = MaxLogit(logits);
  std::fill(probs.begin(), probs.end(), 0.0f);
  if (greedy_ || !(max_logit > -kInf && max_logit < kInf)) {
    probs[FirstIndexOf(logits, max_logit)] = 1.0f;
    return;
  }
  // The kept set and weights exactly as Sample computes them.
  const float inv_temp = 1.0f / temperature_;
  double mass = 0.0;
  if (top_k_ > 0 && top_k_ < vocab) {
    SelectTopK(logits, top_k_);
    mass = CandidateWeights(logits, max_logit, inv_temp);
    if (top_p_ < 1.0f) mass = ApplyTopP(mass);
  } else {
    mass = VocabWeights(logits, max_logit, inv_temp, &vocab_weights_);
    if (top_p_ >= 1.0f) {
      for (int i = 0; i < vocab; ++i) probs[i] = static_cast<float>(vocab_weights_[i] / mass);
      return;
    }
    mass = VocabTopP(logits, mass);
  }
  for (size_t i = 0; i < candidates_.size(); ++i) {
    probs[candidates_[i]] = static_cast<float>(candidate_weights_[i] / mass);
  }
}

SampleResult Sampler::Describe(std::span<const float> logits, int32_t token) {
  PD_CHECK(token >= 0 && static_cast<size_t>(token) < logits.size());
  const float max_logit = MaxLogit(logits);
  SampleResult result;
  result.token = token;
  if (!(max_logit > -kInf && max_logit < kInf)) {
    result.logprob = logits[token] == max_logit ? (max_logit == kInf ? 0.0f : -kInf) : -kInf;
    FillTopLogprobs(logits, std::numeric_limits<double>::quiet_NaN(), &result);
    return result;
  }
  const double raw_mass = VocabWeights(logits, max_logit, 1.0f, &vocab_weights_);
  const double log_normalizer = max_logit + std::log(raw_mass);
  result.logprob = static_cast<float>(logits[token] - log_normalizer);
  FillTopLogprobs(logits, log_normalizer, &result);
  return result;
}

void Sampler::SelectTopK(std::span<const float> logits, int k) {
  const int vocab = static_cast<int>(logits.size());
  k = std::min(k, vocab);
  candidates_.clear();
  if (k <= kHeapSelectMaxK) {
    // Bounded heap whose front is the worst kept candidate. Ids arrive in increasing order,
    // so a later id with an equal logit never displaces an earlier one.
    const auto heap_order = [](const ScoredId& a, const ScoredId& b) {
      return Better(a.key, a.id, b.key, b.id);
    };
    heap_.clear();
    int32_t id = 0;
    for (; id < vocab && static_cast<int>(heap_.size()) < k; ++id) {
      heap_.push_back({RankKey(logits[id]), id});
      std::push_heap(heap_.begin(), heap_.end(), heap_order);
    }
    float worst = heap_.front().key;
    for (; id < vocab; ++id) {
      if (logits[id] > worst) {  // the common case is a cheap miss; NaN compares false
        std::pop_heap(heap_.begin(), heap_.end(), heap_order);
        heap_.back() = {logits[id], id};
        std::push_heap(heap_.begin(), heap_.end(), heap_order);
        worst = heap_.front().key;
      }
    }
    std::sort_heap(heap_.begin(), heap_.end(), heap_order);
    for (const ScoredId& c : heap_) candidates_.push_back(c.id);
    return;
  }
  const auto better = [&](int32_t a, int32_t b) {
    return Better(RankKey(logits[a]), a, RankKey(logits[b]), b);
  };
  candidates_.resize(vocab);
  std::iota(candidates_.begin(), candidates_.end(), 0);
  if (k < vocab) {
    std::nth_element(candidates_.begin(), candidates_.begin() + k, candidates_.end(), better);
    candidates_.resize(k);
  }
  std::sort(candidates_.begin(), candidates_.end(), better);
}

double Sampler::CandidateWeights(std::span<const float> logits, float max_logit, float inv_temp) {
  candidate_weights_.resize(candidates_.size());
  double mass = 0.0;
  for (size_t i = 0; i < candidates_.size(); ++i) {
    candidate_weights_[i] = ExpNonPositive((logits[candidates_[i]] - max_logit) * inv_temp);
    mass += candidate_weights_[i];
  }
  return mass;
}

double Sampler::ApplyTopP(double total_mass) {
  const double threshold = static_cast<double>(top_p_) * total_mass;
  double kept_mass = 0.0;
  size_t kept = 0;
  // The first candidate is always kept: its preceding mass is 0 < threshold.
  while (kept < candidates_.size() && kept_mass < threshold) {
    kept_mass += candidate_weights_[kept];
    ++kept;
  }
  candidates_.resize(kept);
  candidate_weights_.resize(kept);
  return kept_mass;
}

double Sampler::VocabTopP(std::span<const float> logits, double total_mass) {
  const double threshold = static_cast<double>(top_p_) * total_mass;
  const float* w = vocab_weights_.data();
  const int32_t vocab = static_cast<int32_t>(vocab_weights_.size());
  candidates_.clear();
  candidate_weights_.clear();
  double kept_mass = 0.0;
  auto keep = [&](int32_t id) {
    candidates_.push_back(id);
    candidate_weights_.push_back(w[id]);
    kept_mass += w[id];
  };

  // Positive floats order like their bit patterns, so the weights' bits are radix digits:
  // bits 30..20, 19..10 and 9..0. At each level, buckets whose mass lies wholly before the
  // threshold are kept and only the bucket that straddles it goes on to the next digit.
  constexpr int kBuckets = 1024;
  constexpr int kShifts[] = {20, 10, 0};
  constexpr size_t kSortDirectly = 64;
  auto digit = [&](int32_t id, int shift) {
    const uint32_t bits = std::bit_cast<uint32_t>(w[id]) >> shift;
    // Weights are <= 1 (bits <= 0x3F800000), so the top digit fits; min() is a guard only.
    return static_cast<int>(shift == kShifts[0] ? std::min<uint32_t>(bits, kBuckets - 1)
                                                : bits & (kBuckets - 1));
  };
  bucket_mass_.resize(kBuckets);
  for (int level = 0; level < 3; ++level) {
    const int shift = kShifts[level];
    // Level 0 walks the whole vocabulary (ids with no weight can never be drawn).
    auto for_each_in_pool = [&](auto&& fn) {
      if (level == 0) {
        for (int32_t id = 0; id < vocab; ++id) {
          if (w[id] > 0.0f) fn(id);
        }
      } else {
        for (int32_t id : pool_) fn(id);
      }
    };
    std::fill(bucket_mass_.begin(), bucket_mass_.end(), 0.0);
    for_each_in_pool([&](int32_t id) { bucket_mass_[digit(id, shift)] += w[id]; });
    int straddling = -1;  // stays -1 if rounding leaves the whole pool below the threshold
    double before = kept_mass;
    for (int b = kBuckets - 1; b >= 0; --b) {
      if (bucket_mass_[b] == 0.0) continue;
      if (before + bucket_mass_[b] >= threshold) {
        straddling = b;
        break;
      }
      before += bucket_mass_[b];
    }
    next_pool_.clear();
    for_each_in_pool([&](int32_t id) {
      const int d = digit(id, shift);
      if (d > straddling) {
        keep(id);
      } else if (d == straddling) {
        next_pool_.push_back(id);
      }
    });
    std::swap(pool_, next_pool_);
    if (pool_.size() <= kSortDirectly) break;
  }
  // The straddling ids, in candidate order, are kept while the mass before them is short.
  std::sort(pool_.begin(), pool_.end(),
            [&](int32_t a, int32_t b) { return Better(logits[a], a, logits[b], b); });
  for (int32_t id : pool_) {
    if (kept_mass >= threshold && !candidates_.empty()) break;
    keep(id);
  }
  return kept_mass;
}

int32_t Sampler::DrawFromCandidates(double mass) {
  PD_CHECK(!candidates_.empty());
  const double target = Uniform() * mass;
  double cumulative = 0.0;
  size_t last_positive = 0;
  for (size_t i = 0; i < candidates_.size(); ++i) {
    if (candidate_weights_[i] <= 0.0f) continue;
    cumulative += candidate_weights_[i];
    last_positive = i;
    if (target < cumulative) return candidates_[i];
  }
  return candidates_[last_positive];  // rounding left target at the very top
}

int32_t Sampler::DrawFromVocab(double mass) {
  const double target = Uniform() * mass;
  double cumulative = 0.0;
  int32_t last_positive = 0;
  for (size_t i = 0; i < vocab_weights_.size(); ++i) {
    if (vocab_weights_[i] <= 0.0f) continue;
    cumulative += vocab_weights_[i];
    last_positive = static_cast<int32_t>(i);
    if (target < cumulative) return last_positive;
  }
  return last_positive;
}

void Sampler::FillTopLogprobs(std::span<const float> logits, double log_normalizer,
                              SampleResult* out) {
  if (num_logprobs_ <= 0) return;
  SelectTopK(logits, num_logprobs_);
  out->top_logprobs.reserve(candidates_.size());
  for (int32_t id : candidates_) {
    float logprob;
    if (std::isnan(log_normalizer)) {  // degenerate logits: only the pick has any mass
      logprob = id == out->token ? out->logprob : -kInf;
    } else {
      logprob = static_cast<float>(logits[id] - log_normalizer);
    }
    out->top_logprobs.push_back({id, logprob});
  }
}

}  // namespace pdserve
