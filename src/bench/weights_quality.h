// The quality of a model's weights held in another format (`--weights fp8|int8`) against a
// reference load of the same checkpoint (BF16): greedy agreement over long continuations and the
// KL divergence of the next-token distributions over a text. Runs the models' Forward on the
// calling thread (each model's kernels parallelise as usual); call from one thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/transformer.h"

namespace pdserve::bench {

struct WeightsQualityOptions {
  std::vector<std::vector<int32_t>> prompts;  // each continued greedily by both models
  int continuation = 256;                     // tokens generated after each prompt
  std::vector<int32_t> text;                  // teacher-forced through both models
};

struct WeightsQuality {
  // Greedy continuations: the mean fraction of a continuation that is identical to the
  // reference's before the first token that differs, and the fraction of positions whose tokens
  // are equal (after a divergence the two follow different contexts).
  double identical_prefix = 0;
  double tokens_equal = 0;
  // Over the text: KL(reference || candidate) of the next-token distributions (nats), the mean
  // and the largest over positions, and the fraction of positions whose most likely tokens agree.
  double mean_kl = 0;
  double max_kl = 0;
  double top1_agreement = 0;
};

// InvalidArgument for empty prompts or text, a prompt plus continuation or the text beyond
// either model's context, models of different vocabularies; Forward's errors pass through.
Result<WeightsQuality> CompareWeights(Transformer& reference, Transformer& candidate,
                                      const WeightsQualityOptions& options);

// KL(p || q) in nats of softmax(p_logits) and softmax(q_logits), in double.
double KlDivergence(const std::vector<float>& p_logits, const std::vector<float>& q_logits);

}  // namespace pdserve::bench
