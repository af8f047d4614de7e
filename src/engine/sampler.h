// Sampler: picks the next token of one sequence from its logits (greedy, temperature, top-k,
// top-p) with a per-sequence seeded RNG, and reports logprobs.
// One Sampler per sequence; thread-compatible (a sequence is sampled by one thread at a time).
// SeedSource is thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "engine/sampling_params.h"

namespace pdserve {

// Process-wide source of seeds for requests that bring none. Seeded once at startup (from a
// flag for reproducible runs, or from std::random_device); Next() is safe from any thread.
class SeedSource {
 public:
  explicit SeedSource(uint64_t seed) : state_(seed) {}
  SeedSource(const SeedSource&) = delete;
  SeedSource& operator=(const SeedSource&) = delete;

  // SplitMix64 over an atomic counter: distinct, well-mixed seeds without a lock.
  uint64_t Next();

 private:
  std::atomic<uint64_t> state_;
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
  friend bool operator==(const TokenLogprob&, const TokenLogprob&) = default;
};

struct SampleResult {
  int32_t token = 0;
  // log-softmax of the raw logits (temperature 1, before top-k/top-p), as vLLM reports by
  // default: comparable across requests whatever their sampling settings.
  float logprob = 0.0f;
  // The params.logprobs most likely tokens under the same raw distribution, most likely first
  // (ties: lower id first). Empty when params.logprobs == 0.
  std::vector<TokenLogprob> top_logprobs;
};

class Sampler {
 public:
  // Precondition: params.Validate(vocab) is ok. The RNG is seeded with params.seed, or with
  // seeds.Next() when the request has none (read it back with seed() to replay a request).
  Sampler(const SamplingParams& params, SeedSource& seeds);
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;
  Sampler(Sampler&&) = default;
  Sampler& operator=(Sampler&&) = default;

  // Chooses the next token from one position's logits (size = vocabulary, not empty).
  //  - greedy (temperature <= 1e-5 or top_k == 1): argmax, ties to the lowest id; no RNG draw;
  //  - otherwise weights exp((logit - max) / temperature); top-k keeps the k largest logits;
  //    top-p then keeps, in order of decreasing weight, each token whose preceding mass is
  //    below top_p of the (top-k) total, so at least one token always stays; one uniform draw
  //    picks among the kept tokens.
  // Same seed and same logits sequence => same tokens. Logits may hold -inf (masked) and
  // NaN (treated as -inf); if no logit is finite the result is the greedy pick.
  // Allocates only the top_logprobs vector (when asked for) after the first call.
  SampleResult Sample(std::span<const float> logits);

  uint64_t seed() const { return seed_; }
  bool greedy() const { return greedy_; }

  // Speculative decoding (engine/spec_sampling.h) needs the distribution Sample draws from and
  // draws of its own from the same RNG:
  // - Distribution: probs[id] = the probability Sample would pick id (temperature, top-k and
  //   top-p applied, normalised; 0 outside the kept set; greedy: 1 for the argmax). probs has
  //   the vocabulary's size. No RNG draw.
  // - Describe: the result Sample would report had it picked `token` (its raw logprob and the
  //   top alternatives).
  // - Uniform: the next draw in [0, 1) of this sequence's RNG, from 53 bits: identical on every
  //   standard library, unlike std::uniform_real_distribution.
  void Distribution(std::span<const float> logits, std::span<float> probs);
  SampleResult Describe(std::span<const float> logits, int32_t token);
  double Uniform();

 private:
  friend class SamplerTestPeer;  // reads the kept candidate set after Sample()

  struct ScoredId {
    float key;
    int32_t id;
  };

  // Ids of the k largest logits into candidates_, ordered by (logit desc, id asc).
  void SelectTopK(std::span<const float> logits, int k);
  // Fills candidate_weights_ for candidates_ at the given temperature; returns their sum.
  double CandidateWeights(std::span<const float> logits, float max_logit, float inv_temp);
  // Keeps the top-p prefix of the sorted candidates_; returns the kept mass.
  double ApplyTopP(double total_mass);
  // Top-p over the whole vocabulary (weights in vocab_weights_) without sorting it: a radix
  // walk over the weights' float bits finds the kept set, and only the few ids that straddle
  // the threshold are sorted. Leaves the kept set in candidates_; returns its mass.
  double VocabTopP(std::span<const float> logits, double total_mass);
  int32_t DrawFromCandidates(double mass);
  int32_t DrawFromVocab(double mass);
  void FillTopLogprobs(std::span<const float> logits, double log_normalizer, SampleResult* out);

  float temperature_;
  int top_k_;  // <= 0: off
  float top_p_;
  int num_logprobs_;
  bool greedy_;
  uint64_t seed_;
  std::mt19937_64 rng_;
  // Reused between calls so that sampling does not allocate per token.
  std::vector<float> vocab_weights_;  // one weight per id
  std::vector<int32_t> candidates_;
  std::vector<float> candidate_weights_;  // parallel to candidates_
  std::vector<ScoredId> heap_;
  std::vector<int32_t> pool_, next_pool_;
  std::vector<double> bucket_mass_;
};

}  // namespace pdserve
