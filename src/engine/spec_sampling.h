// How speculative decoding picks drafted tokens and judges them against the target's logits.
// Free functions over one Sequence; loop thread only (the sequence's owner).
#pragma once

#include <cstdint>
#include <span>

#include "engine/sequence.h"

namespace pdserve {

// The token the drafter proposes next for `seq` from its logits: the argmax (ties to the lowest
// id), as the target's greedy sampler picks.
int32_t PickDraftToken(Sequence& seq, std::span<const float> logits);

}  // namespace pdserve
