#include "model/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace pdserve {

namespace {

// YaRN (DeepSeek's yarn_find_correction_dim): the dimension index whose wavelength makes
// `rotations` turns over the original context.
double YarnCorrectionDim(double rotations, int dim, double base, int original_context) {
  return dim * std::log(original_context / (rotations * 2 * std::numbers::pi)) /
         (2 * std::log(base));
}

// YaRN: extrapolated (original) frequencies where a dimension turns more than beta_fast times
// over the original context, interpolated (divided by factor) below beta_slow turns, a linear
// ramp between.
void ApplyYarn(const RopeScaling& rs, int dim, double base, std::vector<double>& inv) {
  const int half = dim / 2;
  double low =
      std::floor(YarnCorrectionDim(rs.beta_fast, dim, base, rs.original_max_position_embeddings));
  double high =
      std::ceil(YarnCorrectionDim(rs.beta_slow, dim, base, rs.original_max_position_embeddings));
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // yarn_linear_ramp_mask's guard against a zero span
  for (int i = 0; i < half; ++i) {
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double extrapolation = 1.0 - ramp;  // inv_freq_mask
    inv[i] = inv[i] / rs.factor * (1.0 - extrapolation) + inv[i] * extrapolation;
  }
}

}  // namespace

std::vector<double> RopeInverseFrequencies(const ModelConfig& config) {
  const int dim = config.rotary_dim();
  const int half = dim / 2;
  std::vector<double> inv(half);
  for (int i = 0; i < half; ++i) {
    inv[i] = std::pow(config.rope_theta, -2.0 * i / dim);
  }
  const RopeScaling& rs = config.rope_scaling;
  if (rs.type == RopeScaling::Type::kYarn) {
    ApplyYarn(rs, dim, config.rope_theta, inv);
  } else if (rs.type == RopeScaling::Type::kLinear) {
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
      cos_[row * half + j] = static_cast<float>(std::cos(angle) * factor_);
      sin_[row * half + j] = static_cast<float>(std::sin(angle) * factor_);
    }
  }
}

}  // namespace pdserve
