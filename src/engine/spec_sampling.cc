#include "engine/spec_sampling.h"

#include "common/check.h"

namespace pdserve {
namespace {

// Index drawn from the weights w (summing to `total` > 0) by the uniform u.
int32_t DrawFromWeights(std::span<const float> w, double total, double u) {
  const double target = u * total;
  double cumulative = 0.0;
  int32_t last_positive = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i] <= 0.0f) continue;
    cumulative += w[i];
    last_positive = static_cast<int32_t>(i);
    if (target < cumulative) return last_positive;
  }
  return last_positive;  // rounding left target at the very top
}

}  // namespace

int32_t PickDraftToken(Sequence& seq, std::span<const float> logits) {
  if (seq.sampler.greedy()) {
    int32_t best = 0;
    for (size_t i = 1; i < logits.size(); ++i) {
      if (logits[i] > logits[best]) best = static_cast<int32_t>(i);  // NaN never wins
    }
    return best;
  }
  const size_t vocab = logits.size();
  const size_t index = seq.drafts.size();
  seq.draft_probs.resize((index + 1) * vocab);
  const std::span<float> q(&seq.draft_probs[index * vocab], vocab);
  seq.sampler.Distribution(logits, q);
  return DrawFromWeights(q, 1.0, seq.sampler.Uniform());
}

VerifiedToken VerifyRow(Sequence& seq, std::span<const float> logits, int row, int drafted,
                        std::vector<float>& scratch) {
  PD_CHECK(drafted <= static_cast<int>(seq.drafts.size()));
  if (row >= drafted) return {.sample = seq.sampler.Sample(logits), .accepted = false};
  const int32_t draft = seq.drafts[row];
  if (seq.sampler.greedy()) {
    SampleResult sample = seq.sampler.Sample(logits);
    const bool accepted = sample.token == draft;
    return {.sample = std::move(sample), .accepted = accepted};
  }
  const size_t vocab = logits.size();
  PD_CHECK(seq.draft_probs.size() >= (static_cast<size_t>(row) + 1) * vocab);
  const std::span<const float> q(&seq.draft_probs[row * vocab], vocab);
  scratch.resize(vocab);
  const std::span<float> p(scratch);
  seq.sampler.Distribution(logits, p);
  // Keep d with probability min(1, p(d) / q(d)); q(d) > 0, since d was drawn from q.
  if (seq.sampler.Uniform() * q[draft] < p[draft]) {
    return {.sample = seq.sampler.Describe(logits, draft), .accepted = true};
  }
  // Rejected: draw from max(0, p - q), normalised (p itself should rounding leave nothing).
  double residual = 0.0;
  for (size_t i = 0; i < vocab; ++i) {
    p[i] = p[i] > q[i] ? p[i] - q[i] : 0.0f;
    residual += p[i];
  }
  const double u = seq.sampler.Uniform();
  int32_t token;
  if (residual > 0.0) {
    token = DrawFromWeights(p, residual, u);
  } else {
    seq.sampler.Distribution(logits, p);
    token = DrawFromWeights(p, 1.0, u);
  }
  return {.sample = seq.sampler.Describe(logits, token), .accepted = false};
}

}  // namespace pdserve
