#include "bench/weights_quality.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <span>

#include <fmt/format.h>

#include "kv/kv_cache.h"

namespace pdserve::bench {
namespace {

constexpr int kQualityPageTokens = 16;

// One sequence through one model: tokens fed in order, the last one's logits returned.
class SequenceRun {
 public:
  static Result<SequenceRun> Create(Transformer& model, int64_t tokens) {
    if (tokens > model.config().MaxContext()) {
      return Status::InvalidArgument(fmt::format("{} tokens are beyond the model's context of {}",
                                                 tokens, model.config().MaxContext()));
    }
    const int pages = static_cast<int>((tokens + kQualityPageTokens - 1) / kQualityPageTokens);
    PD_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache,
                        KvCache::Create(model.MakeKvLayout(pages, kQualityPageTokens)));
    SequenceRun run(model, std::move(cache));
    run.pages_.resize(pages);
    for (int i = 0; i < pages; ++i) run.pages_[i] = i;
    return run;
  }
  Result<const std::vector<float>*> Feed(std::span<const int32_t> tokens) {
    const SequenceChunk chunk{
        .tokens = tokens, .start = position_, .pages = pages_, .want_logits = true};
    PD_RETURN_IF_ERROR(
        model_->Forward(std::span<const SequenceChunk>(&chunk, 1), *cache_, &logits_));
    position_ += static_cast<int64_t>(tokens.size());
    return &logits_;
  }

 private:
  SequenceRun(Transformer& model, std::unique_ptr<KvCache> cache)
      : model_(&model), cache_(std::move(cache)) {}
  Transformer* model_;
  std::unique_ptr<KvCache> cache_;
  std::vector<PageId> pages_;
  int64_t position_ = 0;
  std::vector<float> logits_;
};

int32_t Argmax(const std::vector<float>& logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// `n` greedy tokens after `prompt`.
Result<std::vector<int32_t>> Continue(Transformer& model, const std::vector<int32_t>& prompt,
                                      int n) {
  PD_ASSIGN_OR_RETURN(SequenceRun run,
                      SequenceRun::Create(model, static_cast<int64_t>(prompt.size()) + n));
  std::vector<int32_t> out;
  PD_ASSIGN_OR_RETURN(const std::vector<float>* logits, run.Feed(prompt));
  while (static_cast<int>(out.size()) < n) {
    out.push_back(Argmax(*logits));
    if (static_cast<int>(out.size()) == n) break;
    PD_ASSIGN_OR_RETURN(logits, run.Feed(std::span<const int32_t>(&out.back(), 1)));
  }
  return out;
}

}  // namespace

double KlDivergence(const std::vector<float>& p_logits, const std::vector<float>& q_logits) {
  auto log_softmax = [](const std::vector<float>& logits) {
    const double max = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (float v : logits) sum += std::exp(v - max);
    const double log_z = max + std::log(sum);
    std::vector<double> out(logits.size());
    for (size_t i = 0; i < logits.size(); ++i) out[i] = logits[i] - log_z;
    return out;
  };
  const std::vector<double> lp = log_softmax(p_logits), lq = log_softmax(q_logits);
  double kl = 0;
  for (size_t i = 0; i < lp.size(); ++i) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
  return std::max(0.0, kl);
}

Result<WeightsQuality> CompareWeights(Transformer& reference, Transformer& candidate,
                                      const WeightsQualityOptions& options) {
  if (options.prompts.empty() || options.text.size() < 2 || options.continuation < 1) {
    return Status::InvalidArgument("quality needs prompts, a continuation and a text");
  }
  if (reference.config().vocab_size != candidate.config().vocab_size) {
    return Status::InvalidArgument("the two models' vocabularies differ");
  }
  WeightsQuality q;
  for (const std::vector<int32_t>& prompt : options.prompts) {
    if (prompt.empty()) return Status::InvalidArgument("an empty prompt");
    PD_ASSIGN_OR_RETURN(std::vector<int32_t> a, Continue(reference, prompt, options.continuation));
    PD_ASSIGN_OR_RETURN(std::vector<int32_t> b, Continue(candidate, prompt, options.continuation));
    size_t prefix = 0;
    while (prefix < a.size() && a[prefix] == b[prefix]) ++prefix;
    size_t equal = 0;
    for (size_t i = 0; i < a.size(); ++i) equal += a[i] == b[i] ? 1 : 0;
    q.identical_prefix += static_cast<double>(prefix) / static_cast<double>(a.size());
    q.tokens_equal += static_cast<double>(equal) / static_cast<double>(a.size());
  }
  q.identical_prefix /= static_cast<double>(options.prompts.size());
  q.tokens_equal /= static_cast<double>(options.prompts.size());

  const int64_t n = static_cast<int64_t>(options.text.size());
  PD_ASSIGN_OR_RETURN(SequenceRun ra, SequenceRun::Create(reference, n));
  PD_ASSIGN_OR_RETURN(SequenceRun rb, SequenceRun::Create(candidate, n));
  int agree = 0;
  // The distributions of the next token after each of the text's first n - 1 tokens.
  for (int64_t i = 0; i + 1 < n; ++i) {
    const std::span<const int32_t> token(&options.text[i], 1);
    PD_ASSIGN_OR_RETURN(const std::vector<float>* la, ra.Feed(token));
    PD_ASSIGN_OR_RETURN(const std::vector<float>* lb, rb.Feed(token));
    const double kl = KlDivergence(*la, *lb);
    q.mean_kl += kl;
    q.max_kl = std::max(q.max_kl, kl);
    agree += Argmax(*la) == Argmax(*lb) ? 1 : 0;
  }
  q.mean_kl /= static_cast<double>(n - 1);
  q.top1_agreement = static_cast<double>(agree) / static_cast<double>(n - 1);
  return q;
}

}  // namespace pdserve::bench
