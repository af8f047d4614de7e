#include "engine/spec_sampling.h"

namespace pdserve {

int32_t PickDraftToken(Sequence& /*seq*/, std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);  // NaN never wins
  }
  return best;
}

}  // namespace pdserve
