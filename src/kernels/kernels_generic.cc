// The generic kernel path: plain C++ for any CPU, in the reduction order of the SIMD paths
// (kernel_table.h). Explicit std::fma where they fuse, and no contraction by the compiler
// (-ffp-contract=off), so its values are those of its source on every architecture. Slow by
// design; it is the fallback and the reference the other paths are tested against.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "common/dtype.h"
#include "kernels/kernel_table.h"

namespace pdserve::kernels {
namespace {

using internal::kBlockCols;
using internal::kGroupCols;
using internal::kPairElems;
using internal::SumLaneTree16;

// One k pair of x row `row` as (even, odd) floats; the odd half of a last, partial pair is 0.
inline void PairOf(const uint16_t* row, int k, int p, float* even, float* odd) {
  *even = BF16ToF32(row[2 * p]);
  *odd = 2 * p + 1 < k ? BF16ToF32(row[2 * p + 1]) : 0.0f;
}

void PackedTile(const uint16_t* x, const uint16_t* block, float* y, int n, int k, int c0, int t0,
                int groups, int tokens, internal::BlockAhead /*ahead: not used*/) {
  const int cols = groups * kGroupCols;
  const int pairs = internal::Pairs(k);
  float acc[kBlockCols];
  for (int t = t0; t < t0 + tokens; ++t) {
    const uint16_t* row = x + static_cast<size_t>(t) * k;
    for (int c = 0; c < cols; ++c) acc[c] = 0.0f;
    for (int p = 0; p < pairs; ++p) {
      float xe, xo;
      PairOf(row, k, p, &xe, &xo);
      const uint16_t* wp = block + static_cast<size_t>(p) * kPairElems;
      // vdpbf16ps: odd product, then even; a BF16 x BF16 product is exact in F32, so each
      // step equals an FMA.
      for (int c = 0; c < cols; ++c) {
        acc[c] = acc[c] + xo * BF16ToF32(wp[2 * c + 1]);
        acc[c] = acc[c] + xe * BF16ToF32(wp[2 * c]);
      }
    }
    float* yr = y + static_cast<size_t>(t) * n + c0;
    for (int c = 0; c < cols && c0 + c < n; ++c) yr[c] = acc[c];
  }
}

// ---- FP8 and INT8 products over packed weights (layouts and order: kernel_table.h) ----

// The widened value of every FP8 byte, fp8 * 2^-120: the BF16 whose bits 15 and 10..4 are the
// byte's (the avx paths' shifts and mask), read as vdpbf16ps reads it (a denormal as zero; the
// packing already stored subnormals as zeros).
struct Fp8Widened {
  float value[256];
  Fp8Widened() {
    for (int b = 0; b < 256; ++b) {
      const auto bits =
          static_cast<uint16_t>(((b & 0x80) << 8 | (b & 0x7f) << 4) & internal::kFp8BF16Mask);
      value[b] = (b & 0x78) == 0 ? 0.0f : BF16ToF32(bits);
    }
  }
};

// One tile of the FP8 products: `widened` maps a byte to its value, `position` places a
// column's even or odd byte in a pair line. x: BF16 rows of 2 * Pairs(k) values.
void Blocked8Tile(const uint16_t* x, const uint8_t* block, float* y, int n, int k, int c0, int t0,
                  int groups, int tokens, const float* widened, int (*position)(int, int)) {
  const int cols = groups * kGroupCols;
  const size_t stride = 2 * static_cast<size_t>(internal::Pairs(k));
  float acc[kBlockCols], part[kBlockCols], scales[kBlockCols];
  for (int t = t0; t < t0 + tokens; ++t) {
    const uint16_t* row = x + static_cast<size_t>(t) * stride;
    for (int c = 0; c < cols; ++c) acc[c] = 0.0f;
    const uint8_t* at = block;
    for (int k0 = 0; k0 < k; k0 += internal::kFp8BlockK) {
      const int pairs = internal::Pairs(std::min(internal::kFp8BlockK, k - k0));
      std::memcpy(scales, at, sizeof(scales));
      at += internal::kFp8ScaleBytes;
      for (int c = 0; c < cols; ++c) part[c] = 0.0f;
      for (int p = 0; p < pairs; ++p) {
        const float xe = BF16ToF32(row[k0 + 2 * p]);
        const float xo = BF16ToF32(row[k0 + 2 * p + 1]);
        // vdpbf16ps: odd product, then even (exact products: each step equals an FMA).
        for (int c = 0; c < cols; ++c) {
          part[c] = part[c] + xo * widened[at[position(c, 1)]];
          part[c] = part[c] + xe * widened[at[position(c, 0)]];
        }
        at += internal::kPairLineBytes;
      }
      for (int c = 0; c < cols; ++c) acc[c] = std::fma(part[c], scales[c], acc[c]);
    }
    float* yr = y + static_cast<size_t>(t) * n + c0;
    for (int c = 0; c < cols && c0 + c < n; ++c) yr[c] = acc[c];
  }
}

void Fp8Tile(const uint16_t* x, const uint8_t* block, float* y, int n, int k, int c0, int t0,
             int groups, int tokens, internal::BlockAhead /*ahead: not used*/,
             uint16_t* /*strip: not used (no widening)*/) {
  static const Fp8Widened widened;
  Blocked8Tile(x, block, y, n, k, c0, t0, groups, tokens, widened.value,
               [](int c, int odd) { return internal::Fp8PairPosition(c, odd); });
}

// INT8 (layout, quantisation and order: kernel_table.h). The row's maximum, then each value
// times 127 / max rounded to nearest even (nearbyint in the default rounding mode, as the
// vector paths' conversions round).
void QuantiseRow(const float* x, int k, int8_t* xq, float* x_scales, int32_t* x_corrections) {
  for (int k0 = 0, j = 0; k0 < k; k0 += internal::kFp8BlockK, ++j) {
    const int kb = std::min(internal::kFp8BlockK, k - k0);
    float a = 0.0f;
    bool finite = true;
    for (int i = 0; i < kb; ++i) {
      const float v = std::fabs(x[k0 + i]);
      finite = finite && v <= FLT_MAX;  // false for inf and NaN
      a = v > a ? v : a;
    }
    float inv = 0.0f;
    if (!finite) {
      x_scales[j] = NAN;
    } else if (a < internal::kInt8TinyBlock) {
      x_scales[j] = 0.0f;
    } else {
      x_scales[j] = a / 127.0f;
      inv = 127.0f / a;
    }
    int32_t sum = 0;
    for (int i = 0; i < kb; ++i) {
      const float q = finite ? std::clamp(std::nearbyint(x[k0 + i] * inv), -127.0f, 127.0f) : 0.0f;
      xq[k0 + i] = static_cast<int8_t>(q);
      sum += static_cast<int32_t>(q);
    }
    x_corrections[j] = internal::kInt8WOffset * sum;
  }
  for (int i = k; i < internal::Int8RowBytes(k); ++i) xq[i] = 0;
}

void Int8Tile(const int8_t* xq, const float* x_scales, const int32_t* x_corrections,
              const uint8_t* block, float* y, int n, int k, int c0, int t0, int groups, int tokens,
              internal::BlockAhead /*ahead*/) {
  const int cols = groups * kGroupCols;
  const size_t row_bytes = static_cast<size_t>(internal::Int8RowBytes(k));
  const int k_blocks = internal::Int8KBlocks(k);
  float acc[kBlockCols], scales[kBlockCols];
  int32_t sums[kBlockCols];
  for (int t = t0; t < t0 + tokens; ++t) {
    const int8_t* row = xq + static_cast<size_t>(t) * row_bytes;
    for (int c = 0; c < cols; ++c) acc[c] = 0.0f;
    const uint8_t* at = block;
    for (int j = 0; j < k_blocks; ++j) {
      const int k0 = j * internal::kFp8BlockK;
      const int quads = internal::Int8RowBytes(std::min(internal::kFp8BlockK, k - k0)) / 4;
      std::memcpy(scales, at, sizeof(scales));
      at += internal::kInt8BlockHeadBytes;
      for (int c = 0; c < cols; ++c) sums[c] = 0;
      for (int q = 0; q < quads; ++q) {
        for (int c = 0; c < cols; ++c) {
          for (int i = 0; i < 4; ++i) {
            sums[c] +=
                static_cast<int32_t>(at[internal::Int8QuadPosition(c, i)]) * row[k0 + 4 * q + i];
          }
        }
        at += internal::kInt8QuadLineBytes;
      }
      const size_t tj = static_cast<size_t>(t) * k_blocks + j;
      const float sx = x_scales[tj];
      for (int c = 0; c < cols; ++c) {
        acc[c] = std::fma(static_cast<float>(sums[c] - x_corrections[tj]), scales[c] * sx, acc[c]);
      }
    }
    float* yr = y + static_cast<size_t>(t) * n + c0;
    for (int c = 0; c < cols && c0 + c < n; ++c) yr[c] = acc[c];
  }
}

// 16 lanes over k (lane j: elements j, j + 16, ...; missing elements are zeros, as a masked
// load gives them), then the lane tree.
float DotLanes16(const float* x, const float* w, int k) {
  float acc[16] = {};
  for (int kk = 0; kk < k; kk += 16) {
    for (int j = 0; j < 16; ++j) {
      const bool live = kk + j < k;
      acc[j] = std::fma(live ? x[kk + j] : 0.0f, live ? w[kk + j] : 0.0f, acc[j]);
    }
  }
  return SumLaneTree16(acc);
}

void F32Tile(const float* x, const float* w, float* y, int n, int k, int r0, int t0, int rows,
             int tokens) {
  for (int t = t0; t < t0 + tokens; ++t) {
    for (int r = r0; r < r0 + rows; ++r) {
      y[static_cast<size_t>(t) * n + r] =
          DotLanes16(x + static_cast<size_t>(t) * k, w + static_cast<size_t>(r) * k, k);
    }
  }
}

void ToBF16Run(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = F32ToBF16(src[i]);
}

void ToBF16Daz(const float* src, float factor, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = src[i] * factor;
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    dst[i] = (bits & 0x7f800000u) == 0 ? static_cast<uint16_t>(bits >> 16 & 0x8000) : F32ToBF16(v);
  }
}

void RmsNormRow(const float* xr, const float* weight, float* yr, int dim, float eps) {
  const float inv = 1.0f / std::sqrt(DotLanes16(xr, xr, dim) / dim + eps);
  for (int i = 0; i < dim; ++i) yr[i] = xr[i] * inv * weight[i];
}

// The e^x of the SIMD paths, one lane: clamp, n = round(x / ln2), r = x - n ln2 in two FMA
// steps, degree-7 Taylor polynomial by FMA (Horner), times 2^n with one rounding.
float Exp(float x) {
  x = x < 88.3762626647949f ? x : 88.3762626647949f;  // minps/maxps order: NaN -> the bound
  x = x > -103.0f ? x : -103.0f;
  const float n = std::nearbyint(x * 1.44269504088896341f);
  float r = std::fma(-n, 0.693359375f, x);
  r = std::fma(-n, -2.12194440e-4f, r);
  float p = 1.0f / 5040;
  p = std::fma(p, r, 1.0f / 720);
  p = std::fma(p, r, 1.0f / 120);
  p = std::fma(p, r, 1.0f / 24);
  p = std::fma(p, r, 1.0f / 6);
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  return std::ldexp(p, static_cast<int>(n));
}

void SiluMul(const float* gate, const float* up, float* out, int n) {
  for (int i = 0; i < n; ++i) {
    const float g = gate[i];
    const float silu = g / (1.0f + Exp(0.0f - g));
    out[i] = silu * up[i];
  }
}

// A K or V row of head_dim elements, `step` apart, as floats.
template <typename Elem>
struct RowOf {
  const Elem* at;
  int64_t step;
  float operator[](int d) const {
    if constexpr (sizeof(Elem) == sizeof(uint16_t)) {
      return BF16ToF32(at[d * step]);
    } else {
      return at[d * step];
    }
  }
};

// A softmax numerator as the V sum of a BF16 cache weighs it: a denormal one (below 2^-126)
// weighs 0, every other is rounded to BF16, nearest even (as vcvtneps2bf16 converts: denormal
// inputs are zeros; a normal value never rounds to a denormal). The numerators are positive.
inline float WeightBF16(float e) {
  uint32_t bits;
  std::memcpy(&bits, &e, sizeof(bits));
  if ((bits & 0x7f800000u) == 0) return 0.0f;
  return BF16ToF32(F32ToBF16(e));
}

// One query head: scores one position at a time, softmax with a 16-lane sum (lane = position
// mod 16) and the lane tree, then the weighted sum of V rows in position order. key(p) and
// value(p) give row p of K and V (RowOf).
//
// kPairs (a BF16 cache): the products are BF16 dot products as vdpbf16ps computes them, each
// step one FMA (a BF16 x BF16 product is exact in F32). Scores: q is rounded to BF16 (by the
// caller) and the sum over d goes pair by pair (d, d + 1), the odd element's product first; a
// missing odd element (odd hd) adds 0 x 0. V sum: the numerators are rounded to BF16
// (WeightBF16) before the sum of the softmax and the V sum use them, and positions go pair by
// pair (p, p + 1) from 0, odd position first; a missing odd position adds 0 x 0.
template <bool kPairs, typename KeyAt, typename ValueAt>
void AttendHead(const float* q, KeyAt key, ValueAt value, int64_t ctx, int hd, float scale,
                float* out, float* scores) {
  float max_score = -INFINITY;
  for (int64_t p = 0; p < ctx; ++p) {
    const auto k = key(p);
    float acc = 0.0f;
    if constexpr (kPairs) {
      for (int d = 0; d < hd; d += 2) {
        const bool odd = d + 1 < hd;
        acc = std::fma(odd ? q[d + 1] : 0.0f, odd ? k[d + 1] : 0.0f, acc);
        acc = std::fma(q[d], k[d], acc);
      }
    } else {
      for (int d = 0; d < hd; ++d) acc = std::fma(q[d], k[d], acc);
    }
    scores[p] = acc * scale;
    max_score = max_score > scores[p] ? max_score : scores[p];
  }
  float lanes[16] = {};
  for (int64_t p = 0; p < ctx; ++p) {
    scores[p] = Exp(scores[p] - max_score);
    if constexpr (kPairs) scores[p] = WeightBF16(scores[p]);
    lanes[p % 16] = lanes[p % 16] + scores[p];
  }
  const float inv_sum = 1.0f / SumLaneTree16(lanes);
  float acc[16 * internal::kMaxHeadChunks] = {};
  if constexpr (kPairs) {
    for (int64_t p = 0; p < ctx; p += 2) {
      const auto v = value(p);
      if (p + 1 < ctx) {
        const auto v_odd = value(p + 1);
        for (int d = 0; d < hd; ++d) acc[d] = std::fma(scores[p + 1], v_odd[d], acc[d]);
      } else {
        for (int d = 0; d < hd; ++d) acc[d] = std::fma(0.0f, 0.0f, acc[d]);
      }
      for (int d = 0; d < hd; ++d) acc[d] = std::fma(scores[p], v[d], acc[d]);
    }
  } else {
    for (int64_t p = 0; p < ctx; ++p) {
      const auto v = value(p);
      for (int d = 0; d < hd; ++d) acc[d] = std::fma(scores[p], v[d], acc[d]);
    }
  }
  for (int d = 0; d < hd; ++d) out[d] = acc[d] * inv_sum;
}

// Straight from the pages, each query and head on its own (the values do not depend on how
// the SIMD paths share key tiles between them).
template <typename Elem>
void AttendPagesOf(const internal::PageQuery* queries, int count, const internal::HeadPages& kv,
                   int hd, float scale, int heads, float* scores) {
  auto row = [&](const void* const* pages, int64_t p) {
    return RowOf<Elem>{
        static_cast<const Elem*>(pages[p / kv.page_tokens]) + (p % kv.page_tokens) * hd, 1};
  };
  auto key = [&](int64_t p) { return row(kv.k, p); };
  auto value = [&](int64_t p) { return row(kv.v, p); };
  for (int r = 0; r < count; ++r) {
    for (int h = 0; h < heads; ++h) {
      AttendHead<sizeof(Elem) == sizeof(uint16_t)>(
          queries[r].q + static_cast<size_t>(h) * hd, key, value, queries[r].ctx, hd, scale,
          queries[r].out + static_cast<size_t>(h) * hd, scores);
    }
  }
}

void AttendPages(const internal::PageQuery* queries, int count, const internal::HeadPages& kv,
                 int hd, float scale, int heads, float* scores) {
  if (kv.bf16) {
    AttendPagesOf<uint16_t>(queries, count, kv, hd, scale, heads, scores);
  } else {
    AttendPagesOf<float>(queries, count, kv, hd, scale, heads, scores);
  }
}

#include "kernels/kernels_scalar.inc"

}  // namespace

namespace internal {
const KernelTable kGenericKernels = {
    .name = "generic",
    .packed_tile = PackedTile,
    .packed_tile_tokens = internal::kTokens,
    .f32_tile = F32Tile,
    .fp8_tile = Fp8Tile,
    .int8_tile = Int8Tile,
    .quantise_row = QuantiseRow,
    .to_bf16 = ToBF16Run,
    .to_bf16_daz = ToBF16Daz,
    .rms_norm_row = RmsNormRow,
    .apply_rope = ApplyRope,
    .silu_mul = SiluMul,
    .attend_pages = AttendPages,
};
}  // namespace internal

}  // namespace pdserve::kernels
