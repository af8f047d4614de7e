// Rotary position embedding (rotate_half pairs i and i + head_dim/2): the inverse frequencies of
// a config, and RopeAngles, the cos and sin of each token row's position in a forward pass
// (computed once per pass, read by every layer's attention). RopeAngles is not thread-safe: the
// forward thread owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "model/config.h"

namespace pdserve {

// RoPE inverse frequencies for a config (rotary_dim / 2 of them), with Llama-3, linear or YaRN
// rope scaling applied.
std::vector<double> RopeInverseFrequencies(const ModelConfig& config);

class RopeAngles {
 public:
  explicit RopeAngles(const ModelConfig& config)
      : inv_freq_(RopeInverseFrequencies(config)),
        factor_(RopeAttentionFactor(config.rope_scaling)) {}

  // Computes the angles of each row's position (rows kept until the next call).
  void Compute(std::span<const int64_t> positions);
  // Row `row`'s cos and sin, rotary_dim / 2 floats each.
  const float* cos(int row) const { return &cos_[static_cast<size_t>(row) * inv_freq_.size()]; }
  const float* sin(int row) const { return &sin_[static_cast<size_t>(row) * inv_freq_.size()]; }

 private:
  std::vector<double> inv_freq_;
  double factor_;                 // YaRN's factor on cos and sin (1 otherwise)
  std::vector<float> cos_, sin_;  // [rows][head_dim / 2]
};

}  // namespace pdserve
