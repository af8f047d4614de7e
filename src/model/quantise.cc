#include "model/quantise.h"

#include <algorithm>
#include <cmath>

#include "common/dtype.h"

namespace pdserve {

bool IsQuantisedLinearName(std::string_view name) {
  for (std::string_view kept : {"embed_tokens.weight", "lm_head.weight", ".mlp.gate.weight",
                                ".eh_proj.weight", ".shared_head.head.weight"}) {
    if (name.ends_with(kept)) return false;
  }
  return true;
}

void QuantiseFp8Rows(const float* w, int64_t rows, int64_t cols, uint8_t* out,
                     float* block_scales) {
  const int64_t block_cols = (cols + kQuantBlock - 1) / kQuantBlock;
  for (int64_t r0 = 0; r0 < rows; r0 += kQuantBlock) {
    const int64_t r1 = std::min(rows, r0 + kQuantBlock);
    for (int64_t bc = 0; bc < block_cols; ++bc) {
      const int64_t c0 = bc * kQuantBlock, c1 = std::min(cols, c0 + kQuantBlock);
      float max = 0.0f;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) max = std::max(max, std::fabs(w[r * cols + c]));
      }
      const float scale = max > 0.0f ? max / 448.0f : 1.0f;
      block_scales[(r0 / kQuantBlock) * block_cols + bc] = scale;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) out[r * cols + c] = F32ToF8E4M3(w[r * cols + c] / scale);
      }
    }
  }
}

void QuantiseInt8Rows(const float* w, int64_t rows, int64_t cols, int8_t* out, float* row_scales) {
  const int64_t block_cols = (cols + kQuantBlock - 1) / kQuantBlock;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t bc = 0; bc < block_cols; ++bc) {
      const int64_t c0 = bc * kQuantBlock, c1 = std::min(cols, c0 + kQuantBlock);
      float max = 0.0f;
      for (int64_t c = c0; c < c1; ++c) max = std::max(max, std::fabs(w[r * cols + c]));
      const float scale = max > 0.0f ? max / 127.0f : 1.0f;
      row_scales[r * block_cols + bc] = scale;
      for (int64_t c = c0; c < c1; ++c) {
        // |w / scale| <= 127 up to one rounding of the division: the clamp only catches that.
        const float q = std::nearbyint(w[r * cols + c] / scale);
        out[r * cols + c] = static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f));
      }
    }
  }
}

}  // namespace pdserve
