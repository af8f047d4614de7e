#include "model/rope.h"

#include <cmath>
#include <numbers>

namespace pdserve {

std::vector<double> RopeInverseFrequencies(const ModelConfig& config) {
  const int half = config.head_dim / 2;
  std::vector<double> inv(half);
  for (int i = 0; i < half; ++i) {
    inv[i] = std::pow(config.rope_theta, -2.0 * i / config.head_dim);
  }
  const RopeScaling& rs = config.rope_scaling;
  if (rs.type == RopeScaling::Type::kLinear) {
    for (double& f : inv) f /= rs.factor;
  } else if (rs.type == RopeScaling::Type::kLlama3) {
    const double old_ctx = rs.original_max_position_embeddings;
    const double low_freq_wavelen = old_ctx / rs.low_freq_factor;
    const double high_freq_wavelen = old_ctx / rs.high_freq_factor;
    for (double& f : inv) {
      const double wavelen = 2 * std::numbers::pi / f;
      if (wavelen < high_freq_wavelen) continue;
      if (wavelen > low_freq_wavelen) {
        f /= rs.factor;
      } else {
        const double smooth =
            (old_ctx / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
        f = (1 - smooth) * f / rs.factor + smooth * f;
      }
    }
  }
  return inv;
}

void RopeAngles::Compute(std::span<const int64_t> positions) {
  const size_t half = inv_freq_.size();
  cos_.resize(positions.size() * half);
  sin_.resize(positions.size() * half);
  for (size_t row = 0; row < positions.size(); ++row) {
    for (size_t j = 0; j < half; ++j) {
      const double angle = static_cast<double>(positions[row]) * inv_freq_[j];
      cos_[row * half + j] = static_cast<float>(std::cos(angle));
      sin_[row * half + j] = static_cast<float>(std::sin(angle));
    }
  }
}

}  // namespace pdserve
