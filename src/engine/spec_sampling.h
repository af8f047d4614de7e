// How speculative decoding picks drafted tokens and verifies them against the target's logits,
// so that the output is distributed as the target's alone (greedy: identical to it). Free
// functions over one Sequence; loop thread only (the sequence's owner).
//
// Greedy requests: the draft proposes its argmax; the target keeps a draft while its own greedy
// pick equals it. Sampling requests, the standard rejection scheme (Leviathan et al. 2023, Chen
// et al. 2023): the draft token d is drawn from q, the draft's distribution *after* the
// request's temperature, top-k and top-p (Sampler::Distribution); it is kept with probability
// min(1, p(d) / q(d)), p being the target's distribution after the same processing; a rejected
// position draws from max(0, p - q) normalised; after the last kept draft the target samples
// its own token from p. Both distributions must be the processed ones: the scheme returns
// samples of the p it is given, and p must be what the sampler would draw from without
// speculation. Every draw comes from the sequence's own RNG, in a fixed order, so a seeded
// request is reproducible given the same drafts per step.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/sampler.h"
#include "engine/sequence.h"

namespace pdserve {

// The next drafted token for `seq` (its drafts so far in seq.drafts) from the draft model's
// logits; for a sampling request q is kept in seq.draft_probs for VerifyRow.
int32_t PickDraftToken(Sequence& seq, std::span<const float> logits);

struct VerifiedToken {
  SampleResult sample;    // the token emitted at this position, with the target's logprobs
  bool accepted = false;  // it is draft `row`, kept: the next row may be looked at
};

// The token at verification row `row` of a chunk that verified `drafted` drafts (the first
// `drafted` of seq.drafts; the target's logits after the chunk's token `row`): draft `row`
// kept, or the target's replacement for it, or after the last draft the target's own pick.
// `scratch` holds p between calls.
VerifiedToken VerifyRow(Sequence& seq, std::span<const float> logits, int row, int drafted,
                        std::vector<float>& scratch);

}  // namespace pdserve
