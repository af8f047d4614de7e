// SamplingParams: how one request's tokens are chosen and when its generation ends.
// Plain value type (OpenAI/vLLM field meanings); thread-compatible. Validate() once at admission:
// Sampler and StopChecker assume valid parameters.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace pdserve {

struct SamplingParams {
  // Most top logprobs one request may ask for (OpenAI's limit).
  static constexpr int kMaxLogprobs = 20;
  // Temperatures at or below this are treated as greedy: dividing logits by a smaller value
  // only overflows, and the distribution is already a point mass.
  static constexpr float kGreedyTemperature = 1e-5f;

  float temperature = 1.0f;  // 0 => greedy (argmax, ties to the lowest id)
  int top_k = 0;             // 0 or -1 => off; keep the k most likely tokens
  float top_p = 1.0f;        // nucleus mass in (0, 1]; 1 => off
  // Per-request RNG seed; without one the engine draws a seed from its process-wide SeedSource.
  std::optional<uint64_t> seed;
  int max_tokens = 16;                  // generated tokens, >= 1
  std::vector<std::string> stop;        // stop strings, not included in the output text
  std::vector<int32_t> stop_token_ids;  // tokens that end the sequence, like EOS
  bool ignore_eos = false;              // keep generating past EOS (benchmarks)
  int logprobs = 0;                     // top-N alternatives to return per token, 0 = none

  bool greedy() const { return temperature <= kGreedyTemperature || top_k == 1; }

  // Ok, or InvalidArgument naming the field, its value and the allowed range.
  // vocab_size bounds stop_token_ids and logprobs.
  Status Validate(int vocab_size) const;
};

}  // namespace pdserve
