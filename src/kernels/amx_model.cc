// The AMX tile model (amx_model.h). Plain C++ in the thread's default floating-point
// environment (round to nearest even, no flush-to-zero: nothing in pdserve changes it); compiled
// without FMA contraction, so every rounding below is the one written.
#include "kernels/amx_model.h"

#include <cmath>
#include <cstring>
#include <utility>

#include "common/check.h"
#include "common/dtype.h"

namespace pdserve::kernels::internal {
namespace {

constexpr float kMinNormal = 0x1p-126f;

float Daz(float v) { return std::fpclassify(v) == FP_SUBNORMAL ? std::copysign(0.0f, v) : v; }

// Whether the exact a * b + c, whose correctly rounded value has magnitude 2^-126, is tiny after
// rounding: rounded to 24 bits with an unbounded exponent it stays below 2^-126 (it then lay
// within 2^-150 below 2^-126). Scaling one factor and c by 2^64 is exact and moves the value
// into the normal range, where fmaf rounds with the full 24 bits. A result this small needs
// |c| < 2^-90 and the smaller factor below 2^-44 (else the sum would be a multiple of an ulp
// far above 2^-126), so the scaled operands are finite.
bool TinyAfterRounding(float a, float b, float c) {
  if (std::fabs(a) > std::fabs(b)) std::swap(a, b);
  const float scaled = std::fmaf(std::ldexp(a, 64), b, std::ldexp(c, 64));
  return std::fabs(scaled) < 0x1p-62f;
}

}  // namespace

float FmaDazFtz(float a, float b, float c) {
  a = Daz(a);
  b = Daz(b);
  c = Daz(c);
  const float r = std::fmaf(a, b, c);
  const float magnitude = std::fabs(r);  // NaN fails both tests below and stays NaN
  if (magnitude < kMinNormal) return std::copysign(0.0f, r);
  if (magnitude == kMinNormal && TinyAfterRounding(a, b, c)) return std::copysign(0.0f, r);
  return r;
}

float AddDazFtz(float a, float b) {
  // The exact sum of two normal floats is a multiple of 2^-149: below 2^-126 it is a denormal
  // exactly, so "tiny" and "denormal result" coincide here.
  const float r = Daz(a) + Daz(b);
  return std::fabs(r) < kMinNormal ? std::copysign(0.0f, r) : r;
}

void TileMachine::LoadConfig(const TileConfig& config) {
  if (config.palette_id == 0) {  // the init state, as TILERELEASE
    Release();
    return;
  }
  PD_CHECK_MSG(config.palette_id == 1, "LDTILECFG: only palette 1 is modelled (#GP)");
  PD_CHECK_MSG(config.start_row == 0, "LDTILECFG: start_row restarts are not modelled");
  for (uint8_t r : config.reserved) PD_CHECK_MSG(r == 0, "LDTILECFG: reserved bytes (#GP)");
  for (int t = 0; t < 16; ++t) {
    const bool in_palette = t < kNumTiles;
    PD_CHECK_MSG(config.rows[t] <= (in_palette ? kMaxTileRows : 0), "LDTILECFG: rows (#GP)");
    PD_CHECK_MSG(config.colsb[t] <= (in_palette ? kMaxTileColsb : 0), "LDTILECFG: colsb (#GP)");
  }
  config_ = config;
  configured_ = true;
  std::memset(data_, 0, sizeof(data_));
}

void TileMachine::Release() {
  configured_ = false;
  config_ = TileConfig{};
  std::memset(data_, 0, sizeof(data_));
}

void TileMachine::CheckConfigured(int tile) const {
  PD_CHECK_MSG(configured_, "tile instruction in the init state (#UD)");
  PD_CHECK(tile >= 0 && tile < kNumTiles);
  PD_CHECK_MSG(config_.rows[tile] > 0 && config_.colsb[tile] > 0, "unconfigured tile (#UD)");
}

void TileMachine::Zero(int tile) {
  CheckConfigured(tile);
  std::memset(data_[tile], 0, sizeof(data_[tile]));
}

void TileMachine::Load(int tile, const void* base, size_t stride) {
  CheckConfigured(tile);
  std::memset(data_[tile], 0, sizeof(data_[tile]));
  const auto* src = static_cast<const uint8_t*>(base);
  for (int r = 0; r < config_.rows[tile]; ++r) {
    std::memcpy(data_[tile][r], src + r * stride, config_.colsb[tile]);
  }
}

void TileMachine::Store(int tile, void* base, size_t stride) const {
  CheckConfigured(tile);
  auto* dst = static_cast<uint8_t*>(base);
  for (int r = 0; r < config_.rows[tile]; ++r) {
    std::memcpy(dst + r * stride, data_[tile][r], config_.colsb[tile]);
  }
}

void TileMachine::DotBF16(int c, int a, int b) {
  CheckConfigured(c);
  CheckConfigured(a);
  CheckConfigured(b);
  PD_CHECK_MSG(c != a && c != b && a != b, "TDPBF16PS: tiles must differ (#UD)");
  const int rows = config_.rows[c];
  const int cols = config_.colsb[c] / 4;
  const int pairs = config_.colsb[a] / 4;
  PD_CHECK_MSG(config_.colsb[c] % 4 == 0 && config_.colsb[a] % 4 == 0 && config_.colsb[b] % 4 == 0,
               "TDPBF16PS: colsb not a multiple of 4 (#UD)");
  PD_CHECK_MSG(config_.colsb[c] == config_.colsb[b], "TDPBF16PS: C.colsb != B.colsb (#UD)");
  PD_CHECK_MSG(config_.rows[c] == config_.rows[a], "TDPBF16PS: C.rows != A.rows (#UD)");
  PD_CHECK_MSG(pairs == config_.rows[b], "TDPBF16PS: A.colsb / 4 != B.rows (#UD)");
  auto bf16 = [](const uint8_t* row, int index) {
    uint16_t v;
    std::memcpy(&v, row + 2 * index, sizeof(v));
    return BF16ToF32(v);
  };
  for (int m = 0; m < rows; ++m) {
    float even[kMaxTileColsb / 4] = {};
    float odd[kMaxTileColsb / 4] = {};
    for (int k = 0; k < pairs; ++k) {
      const float a_even = bf16(data_[a][m], 2 * k);
      const float a_odd = bf16(data_[a][m], 2 * k + 1);
      for (int n = 0; n < cols; ++n) {
        even[n] = FmaDazFtz(a_even, bf16(data_[b][k], 2 * n), even[n]);
        odd[n] = FmaDazFtz(a_odd, bf16(data_[b][k], 2 * n + 1), odd[n]);
      }
    }
    for (int n = 0; n < cols; ++n) {
      float acc;
      std::memcpy(&acc, data_[c][m] + 4 * n, sizeof(acc));
      acc = AddDazFtz(acc, AddDazFtz(even[n], odd[n]));
      std::memcpy(data_[c][m] + 4 * n, &acc, sizeof(acc));
    }
    // write_row_and_zero: the bytes past colsb of a written row are zero.
    std::memset(data_[c][m] + config_.colsb[c], 0, kMaxTileColsb - config_.colsb[c]);
  }
  // zero_upper_rows
  for (int m = rows; m < kMaxTileRows; ++m) std::memset(data_[c][m], 0, kMaxTileColsb);
}

}  // namespace pdserve::kernels::internal
