// The avx2 kernel path: AVX2 + FMA + F16C (x86-64-v3). This file alone is compiled with those
// flags; dispatch.cc runs it only on a CPU (and OS) that has them. See kernel_table.h for the
// rule that keeps its code out of the other paths.
//
// It computes what the avx512 path computes, in the same order, on 8-lane vectors: a 16-lane
// accumulator of avx512 is two 8-lane halves (lanes 0-7, 8-15) reduced by the same lane tree,
// and vdpbf16ps is two FMAs per pair, odd product first (exact products, so FMA = mul + add).
// Only where vdpbf16ps flushes denormal inputs or results to zero may the two differ.
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "kernels/kernel_table.h"

namespace pdserve::kernels {
namespace {

using internal::kBlockCols;
using internal::kGroupCols;
using internal::kMaxGroup;
using internal::kPairElems;
using internal::kRows;
using internal::kTokens;
using internal::SumLaneTree16;

// std::min without its out-of-line copy (kernel_table.h).
template <typename T>
constexpr T Min(T a, T b) {
  return b < a ? b : a;
}

// All-ones in lanes [0, remaining), for maskload/maskstore.
inline __m256i TailMask8(int64_t remaining) {
  const int live = static_cast<int>(Min<int64_t>(remaining, 8));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(live), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

inline __m256 LoadTail(const float* p, int64_t remaining) {
  if (remaining >= 8) return _mm256_loadu_ps(p);
  if (remaining <= 0) return _mm256_setzero_ps();
  return _mm256_maskload_ps(p, TailMask8(remaining));
}

inline void StoreTail(float* p, int64_t remaining, __m256 v) {
  if (remaining >= 8) {
    _mm256_storeu_ps(p, v);
  } else if (remaining > 0) {
    _mm256_maskstore_ps(p, TailMask8(remaining), v);
  }
}

// The lane tree of a 16-lane value held as two halves.
inline float SumHalves(__m256 lo, __m256 hi) {
  alignas(32) float lanes[16];
  _mm256_store_ps(lanes, lo);
  _mm256_store_ps(lanes + 8, hi);
  return SumLaneTree16(lanes);
}

// ---- BF16 products over packed weights (layout: kernel_table.h) ----
//
// A 16-column group of one pair is 64 bytes: two loads of 8 columns, each column a 32-bit word
// holding its even element in the low half and its odd element in the high half. Shifting left
// by 16 gives the even elements as F32, masking the low half off gives the odd ones.
//
// Every accumulator takes two dependent FMAs per pair (4 cycles each on Zen 3), so a tile needs
// at least 8 accumulators to keep both FMA pipes busy, and the widening shifts and masks compete
// with the FMAs for the vector pipes: the tiles below keep those per FMA low.
constexpr int kStreamPrefetchPairs = 8;  // as the avx512 path: 2 KB ahead along the block

// One row (decode): all G groups of the block, 2G accumulators. The row's pair is widened in
// registers; the block streams from memory once, prefetched ahead.
template <int G>
void RowTile(const uint16_t* x, const uint16_t* block, float* y, int n, int k, int c0, int t) {
  __m256 acc[G][2];
  for (int g = 0; g < G; ++g) acc[g][0] = acc[g][1] = _mm256_setzero_ps();
  const uint16_t* row = x + static_cast<size_t>(t) * k;
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  auto step = [&](int p, uint32_t pair_bits) {
    const uint16_t* wp = block + static_cast<size_t>(p) * kPairElems;
    for (int g = 0; g < G; ++g) {
      _mm_prefetch(reinterpret_cast<const char*>(wp + kStreamPrefetchPairs * kPairElems + 32 * g),
                   _MM_HINT_T0);
    }
    const __m256i bits = _mm256_set1_epi32(static_cast<int>(pair_bits));
    const __m256 xe = _mm256_castsi256_ps(_mm256_slli_epi32(bits, 16));
    const __m256 xo = _mm256_castsi256_ps(_mm256_and_si256(bits, high));
    for (int g = 0; g < G; ++g) {
      for (int h = 0; h < 2; ++h) {
        const __m256i w =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + 32 * g + 16 * h));
        acc[g][h] = _mm256_fmadd_ps(xo, _mm256_castsi256_ps(_mm256_and_si256(w, high)), acc[g][h]);
        acc[g][h] = _mm256_fmadd_ps(xe, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)), acc[g][h]);
      }
    }
  };
  const int full_pairs = k / 2;
  for (int p = 0; p < full_pairs; ++p) {
    uint32_t bits;
    std::memcpy(&bits, row + 2 * p, sizeof(bits));
    step(p, bits);
  }
  if (k % 2 != 0) step(full_pairs, uint32_t{row[k - 1]});  // the odd partner is zero
  float* yr = y + static_cast<size_t>(t) * n;
  for (int g = 0; g < G; ++g) {
    for (int h = 0; h < 2; ++h) {
      const int c = c0 + kGroupCols * g + 8 * h;
      StoreTail(yr + c, n - c, acc[g][h]);
    }
  }
}

// Several rows: a chunk of pairs of every row is widened to F32 once (odd and even elements
// apart), and the micro tiles broadcast each value from there (a load, no ALU work). Between
// chunks the accumulators wait in a buffer (storing and reloading a float changes nothing).
constexpr int kChunkPairs = 128;
constexpr int kChunkPrefetchPairs = 16;  // 4 KB ahead: a pair takes a micro tile ~12 cycles

struct WidenedRows {
  alignas(32) float odd[kTokens][kChunkPairs];
  alignas(32) float even[kTokens][kChunkPairs];
};

void WidenRows(const uint16_t* x, int k, int t0, int tokens, int p0, int pairs, WidenedRows* out) {
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  const int full = Min(pairs, k / 2 - p0);  // pairs of the chunk with both elements
  for (int t = 0; t < tokens; ++t) {
    const uint16_t* row = x + static_cast<size_t>(t0 + t) * k + 2 * static_cast<size_t>(p0);
    int p = 0;
    for (; p + 8 <= full; p += 8) {
      const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * p));
      _mm256_store_ps(out->odd[t] + p, _mm256_castsi256_ps(_mm256_and_si256(bits, high)));
      _mm256_store_ps(out->even[t] + p, _mm256_castsi256_ps(_mm256_slli_epi32(bits, 16)));
    }
    for (; p < pairs; ++p) {
      const uint32_t even = uint32_t{row[2 * p]} << 16;
      const uint32_t odd = p < full ? uint32_t{row[2 * p + 1]} << 16 : 0;
      std::memcpy(&out->odd[t][p], &odd, sizeof(odd));
      std::memcpy(&out->even[t][p], &even, sizeof(even));
    }
  }
}

// C 8-column vectors x T rows over one chunk. Per pair, the odd products of all C*T
// accumulators come first, then the even ones: only C weight vectors are live at a time (the
// second pass reloads them from L1), which leaves registers for C*T accumulators, and each
// accumulator's two FMAs are C*T FMAs apart, more than their latency. Inlined: compiled on its
// own, GCC 12 spilled 4 of the 12 accumulators of <2, 6> (measured: docs/kernels.md,
// "Products: the avx2 chunk tile inlined").
template <int C, int T>
[[gnu::always_inline]] inline void ChunkTile(const WidenedRows& xw, const uint16_t* w0, int pairs,
                                             float* acc_rows) {
  __m256 acc[C][T];
  for (int c = 0; c < C; ++c)
    for (int t = 0; t < T; ++t) acc[c][t] = _mm256_load_ps(acc_rows + t * kBlockCols + 8 * c);
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  for (int p = 0; p < pairs; ++p) {
    const uint16_t* wp = w0 + static_cast<size_t>(p) * kPairElems;
    _mm_prefetch(reinterpret_cast<const char*>(wp + kChunkPrefetchPairs * kPairElems), _MM_HINT_T0);
    __m256 wv[C];
    for (int c = 0; c < C; ++c) {
      wv[c] = _mm256_castsi256_ps(_mm256_and_si256(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + 16 * c)), high));
    }
    for (int t = 0; t < T; ++t) {
      const __m256 xo = _mm256_broadcast_ss(&xw.odd[t][p]);
      for (int c = 0; c < C; ++c) acc[c][t] = _mm256_fmadd_ps(xo, wv[c], acc[c][t]);
    }
    for (int c = 0; c < C; ++c) {
      wv[c] = _mm256_castsi256_ps(
          _mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + 16 * c)), 16));
    }
    for (int t = 0; t < T; ++t) {
      const __m256 xe = _mm256_broadcast_ss(&xw.even[t][p]);
      for (int c = 0; c < C; ++c) acc[c][t] = _mm256_fmadd_ps(xe, wv[c], acc[c][t]);
    }
  }
  for (int c = 0; c < C; ++c)
    for (int t = 0; t < T; ++t) _mm256_store_ps(acc_rows + t * kBlockCols + 8 * c, acc[c][t]);
}

// All `vecs` 8-column vectors (an even number) of the block for T rows: C at a time (C*T <= 12
// accumulators + C weights + a broadcast fit the 16 registers), 2 for a remainder.
template <int C, int T>
void ChunkColumns(const WidenedRows& xw, const uint16_t* w0, int pairs, float* acc_rows, int vecs) {
  int v = 0;
  for (; v + C <= vecs; v += C) ChunkTile<C, T>(xw, w0 + 16 * v, pairs, acc_rows + 8 * v);
  for (; v < vecs; v += 2) ChunkTile<2, T>(xw, w0 + 16 * v, pairs, acc_rows + 8 * v);
}

void RowsTile(const uint16_t* x, const uint16_t* block, float* y, int n, int k, int c0, int t0,
              int groups, int tokens) {
  alignas(32) float acc_rows[kTokens * kBlockCols] = {};
  WidenedRows xw;
  const int vecs = 2 * groups;
  const int pairs = internal::Pairs(k);
  for (int p0 = 0; p0 < pairs; p0 += kChunkPairs) {
    const int np = Min(kChunkPairs, pairs - p0);
    WidenRows(x, k, t0, tokens, p0, np, &xw);
    const uint16_t* w0 = block + static_cast<size_t>(p0) * kPairElems;
    switch (tokens) {
      case 2:
        ChunkColumns<4, 2>(xw, w0, np, acc_rows, vecs);
        break;
      case 3:
        ChunkColumns<2, 3>(xw, w0, np, acc_rows, vecs);
        break;
      case 4:
        ChunkColumns<2, 4>(xw, w0, np, acc_rows, vecs);
        break;
      case 5:
        ChunkColumns<2, 5>(xw, w0, np, acc_rows, vecs);
        break;
      default:
        ChunkColumns<2, 6>(xw, w0, np, acc_rows, vecs);
        break;
    }
  }
  for (int t = 0; t < tokens; ++t) {
    float* yr = y + static_cast<size_t>(t0 + t) * n;
    for (int v = 0; v < vecs; ++v) {
      const int c = c0 + 8 * v;
      StoreTail(yr + c, n - c, _mm256_load_ps(acc_rows + t * kBlockCols + 8 * v));
    }
  }
}

void PackedTile(const uint16_t* x, const uint16_t* block, float* y, int n, int k, int c0, int t0,
                int groups, int tokens, internal::BlockAhead /*ahead: not used*/) {
  static_assert(kTokens <= 6, "ChunkColumns<2, 6> holds at most 6 rows");
  if (tokens >= 2) {
    RowsTile(x, block, y, n, k, c0, t0, groups, tokens);
    return;
  }
  switch (groups) {
    case 1:
      RowTile<1>(x, block, y, n, k, c0, t0);
      break;
    case 2:
      RowTile<2>(x, block, y, n, k, c0, t0);
      break;
    case 3:
      RowTile<3>(x, block, y, n, k, c0, t0);
      break;
    default:
      RowTile<4>(x, block, y, n, k, c0, t0);
      break;
  }
}

#include "kernels/kernels_avx2_fp8.inc"
#include "kernels/kernels_avx2_int8.inc"

// ---- F32 products ----
//
// The 16 lanes of an avx512 accumulator are independent: the low half (elements kk..kk+7 of
// every 16) and the high half are summed in two passes, R weight rows x T rows of x each.
template <int R, int T>
void TileF32(const float* x, const float* w, float* y, int n, int k, int r0, int t0) {
  alignas(32) float halves[R][T][16];
  for (int half = 0; half < 2; ++half) {
    __m256 acc[R][T];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
    // Every 16-element chunk, as avx512 (a lane past k still adds 0 * 0).
    for (int kk = 0; kk < k; kk += 16) {
      const int at = kk + 8 * half;
      __m256 wv[R];
      for (int r = 0; r < R; ++r)
        wv[r] = LoadTail(w + static_cast<size_t>(r0 + r) * k + at, k - at);
      for (int t = 0; t < T; ++t) {
        const __m256 xv = LoadTail(x + static_cast<size_t>(t0 + t) * k + at, k - at);
        for (int r = 0; r < R; ++r) acc[r][t] = _mm256_fmadd_ps(xv, wv[r], acc[r][t]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) _mm256_store_ps(halves[r][t] + 8 * half, acc[r][t]);
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      y[static_cast<size_t>(t0 + t) * n + r0 + r] = SumLaneTree16(halves[r][t]);
    }
  }
}

void F32Tile(const float* x, const float* w, float* y, int n, int k, int r0, int t0, int rows,
             int tokens) {
  for (int t = 0; t < tokens; t += 2) {
    const bool two = tokens - t >= 2;
    if (rows == kRows) {
      (two ? TileF32<kRows, 2> : TileF32<kRows, 1>)(x, w, y, n, k, r0, t0 + t);
    } else {
      for (int r = r0; r < r0 + rows; ++r)
        (two ? TileF32<1, 2> : TileF32<1, 1>)(x, w, y, n, k, r, t0 + t);
    }
    if (!two) break;
  }
}

// F32ToBF16 (round to nearest even, NaN stays NaN), 8 lanes at a time.
void ToBF16Run(const float* src, uint16_t* dst, int64_t n) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i inf = _mm256_set1_epi32(0x7f800000);
  const __m256i bias = _mm256_set1_epi32(0x7fff);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i quiet = _mm256_set1_epi32(0x00400000);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i u = _mm256_castps_si256(LoadTail(src + i, n - i));
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(bias, lsb));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(u, quiet), nan);
    r = _mm256_srli_epi32(r, 16);
    // 32 -> 16 bits: packus works within 128-bit lanes; the permute joins the two halves.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    const __m128i out = _mm256_castsi256_si128(packed);
    if (n - i >= 8) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), out);
    } else {
      alignas(16) uint16_t tail[8];
      _mm_store_si128(reinterpret_cast<__m128i*>(tail), out);
      std::memcpy(dst + i, tail, sizeof(uint16_t) * (n - i));
    }
  }
}

// ToBF16Run of each value times `factor`, a denormal taken as a zero of its sign (as
// vcvtneps2bf16 reads it: kernel_table.h's to_bf16_daz).
void ToBF16Daz(const float* src, float factor, uint16_t* dst, int64_t n) {
  const __m256 f = _mm256_set1_ps(factor);
  const __m256i exponent = _mm256_set1_epi32(0x7f800000);
  const __m256i sign = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  alignas(32) float row[8];
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 v = _mm256_mul_ps(LoadTail(src + i, n - i), f);
    const __m256i u = _mm256_castps_si256(v);
    const __m256i denormal =
        _mm256_cmpeq_epi32(_mm256_and_si256(u, exponent), _mm256_setzero_si256());
    _mm256_store_ps(
        row, _mm256_castsi256_ps(_mm256_blendv_epi8(u, _mm256_and_si256(u, sign), denormal)));
    ToBF16Run(row, dst + i, Min<int64_t>(8, n - i));
  }
}

// An 8 x 8 transpose in registers: v[i] lane j becomes v[j] lane i.
inline void Transpose8x8(__m256 (&v)[8]) {
  // Pairs of rows interleaved, then pairs of pairs, then the 128-bit halves.
  __m256 a[8], b[8];
  for (int i = 0; i < 8; i += 2) {
    a[i] = _mm256_unpacklo_ps(v[i], v[i + 1]);
    a[i + 1] = _mm256_unpackhi_ps(v[i], v[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    b[i] = _mm256_shuffle_ps(a[i], a[i + 2], 0x44);
    b[i + 1] = _mm256_shuffle_ps(a[i], a[i + 2], 0xee);
    b[i + 2] = _mm256_shuffle_ps(a[i + 1], a[i + 3], 0x44);
    b[i + 3] = _mm256_shuffle_ps(a[i + 1], a[i + 3], 0xee);
  }
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_permute2f128_ps(b[i], b[i + 4], 0x20);
    v[i + 4] = _mm256_permute2f128_ps(b[i], b[i + 4], 0x31);
  }
}

// e^x, 8 lanes: the avx512 path's Exp512 step for step. vscalefps (p * 2^n, one rounding) is
// p * 2^n by exponent bits for n >= -126; below, where the result is denormal, p * 2^(n + 64)
// (exact) times 2^-64 rounds once as well.
inline __m256 Exp256(__m256 x) {
  const __m256 kLog2e = _mm256_set1_ps(1.44269504088896341f);
  const __m256 kLn2Hi = _mm256_set1_ps(0.693359375f);
  const __m256 kLn2Lo = _mm256_set1_ps(-2.12194440e-4f);
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f)), _mm256_set1_ps(-103.0f));
  const __m256 n =
      _mm256_round_ps(_mm256_mul_ps(x, kLog2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, kLn2Hi, x);
  r = _mm256_fnmadd_ps(n, kLn2Lo, r);
  __m256 p = _mm256_set1_ps(1.0f / 5040);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i tiny = _mm256_cmpgt_epi32(_mm256_set1_epi32(-126), ni);
  const __m256i shifted = _mm256_add_epi32(ni, _mm256_and_si256(tiny, _mm256_set1_epi32(64)));
  const __m256 scale =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(shifted, _mm256_set1_epi32(127)), 23));
  const __m256 fix =
      _mm256_blendv_ps(_mm256_set1_ps(1.0f), _mm256_set1_ps(0x1p-64f), _mm256_castsi256_ps(tiny));
  return _mm256_mul_ps(_mm256_mul_ps(p, scale), fix);
}

void SiluMul(const float* gate, const float* up, float* out, int n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  for (int i = 0; i < n; i += 8) {
    const __m256 g = LoadTail(gate + i, n - i);
    const __m256 u = LoadTail(up + i, n - i);
    const __m256 e = Exp256(_mm256_sub_ps(_mm256_setzero_ps(), g));
    const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
    StoreTail(out + i, n - i, _mm256_mul_ps(silu, u));
  }
}

void RmsNormRow(const float* xr, const float* weight, float* yr, int dim, float eps) {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  for (int i = 0; i < dim; i += 16) {
    const __m256 a = LoadTail(xr + i, dim - i);
    const __m256 b = LoadTail(xr + i + 8, dim - i - 8);
    lo = _mm256_fmadd_ps(a, a, lo);
    hi = _mm256_fmadd_ps(b, b, hi);
  }
  const float inv = 1.0f / __builtin_sqrtf(SumHalves(lo, hi) / dim + eps);
  for (int i = 0; i < dim; ++i) yr[i] = xr[i] * inv * weight[i];
}

// ---- Attention ----
//
// The generic path's values on 8 lanes (kernel_table.h): scores take 8 positions per vector,
// one lane per position summing over d in order; the softmax sum keeps the 16 lanes of avx512
// as two halves; the weighted sum of V rows runs over positions in order for each 8-column
// chunk of head_dim. Each head's values depend only on its own q and the rows, never on how
// heads are grouped.

#include "kernels/page_rows.inc"

// Scores of positions [p0, p0 + 8) for G heads: keys [hd][key_stride] holds position p0 + i of
// row d at keys[d * key_stride + i]. Stores scale * (q . k) to scores[h * stride + p0 + i].
// add(i) for i in [0, n) in the order of a sum: i in order, or (kPairs: a BF16 dot product)
// pair by pair, the odd index first, where a missing odd index (n odd) calls add_zero (the
// 0 x 0 that vdpbf16ps adds) instead.
template <bool kPairs, typename Add, typename AddZero>
[[gnu::always_inline]] inline void InSumOrder(int n, Add&& add, AddZero&& add_zero) {
  if constexpr (kPairs) {
    for (int i = 0; i < n; i += 2) {
      if (i + 1 < n) {
        add(i + 1);
      } else {
        add_zero();
      }
      add(i);
    }
  } else {
    for (int i = 0; i < n; ++i) add(i);
  }
}

// kPairs (a BF16 cache): d goes pair by pair, odd element first, a missing one adding 0 x 0.
template <int G, bool kPairs>
void ScoreVector(const float* q, const float* keys, int64_t key_stride, int hd, float scale,
                 float* scores, int64_t stride, int64_t p0) {
  __m256 acc[G];
  for (int h = 0; h < G; ++h) acc[h] = _mm256_setzero_ps();
  auto add_column = [&](int d) {
    const __m256 k = _mm256_loadu_ps(keys + d * key_stride);
    for (int h = 0; h < G; ++h) {
      acc[h] = _mm256_fmadd_ps(_mm256_set1_ps(q[h * hd + d]), k, acc[h]);
    }
  };
  InSumOrder<kPairs>(hd, add_column, [&] {
    for (int h = 0; h < G; ++h) acc[h] = _mm256_add_ps(acc[h], _mm256_setzero_ps());
  });
  const __m256 vscale = _mm256_set1_ps(scale);
  for (int h = 0; h < G; ++h) {
    _mm256_storeu_ps(scores + h * stride + p0, _mm256_mul_ps(acc[h], vscale));
  }
}

// Turns scores [0, ctx) of one head into softmax numerators in place; returns 1 / their sum.
// The maximum takes 8 lanes (position mod 8) in position order, then the lanes in order; the
// sum 16 lanes (position mod 16) and the lane tree.
// kWeightsBF16 (a BF16 cache): each numerator rounded to BF16 (nearest even; a denormal one
// weighs 0) before it is stored and summed, as the generic path's WeightBF16.
template <bool kWeightsBF16>
float SoftmaxNumerators(float* sh, int64_t ctx) {
  __m256 vmax = _mm256_set1_ps(-__builtin_inff());
  for (int64_t p = 0; p < ctx; p += 8) {
    const __m256 live = _mm256_castsi256_ps(TailMask8(ctx - p));
    vmax = _mm256_blendv_ps(vmax, _mm256_max_ps(vmax, _mm256_loadu_ps(sh + p)), live);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  float m = lanes[0];
  for (int i = 1; i < 8; ++i) m = m > lanes[i] ? m : lanes[i];
  const __m256 vm = _mm256_set1_ps(m);
  __m256 vsum[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t p = 0; p < ctx; p += 8) {
    const __m256 live = _mm256_castsi256_ps(TailMask8(ctx - p));
    __m256 e = Exp256(_mm256_sub_ps(_mm256_loadu_ps(sh + p), vm));
    if constexpr (kWeightsBF16) {  // e > 0 and finite: no NaN case
      const __m256i u = _mm256_castps_si256(e);
      const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
      __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
      r = _mm256_and_si256(r, _mm256_set1_epi32(static_cast<int>(0xffff0000u)));
      // Positive: a denormal (exponent 0) is below 0x00800000 as a signed integer too.
      const __m256i normal = _mm256_cmpgt_epi32(u, _mm256_set1_epi32(0x007fffff));
      e = _mm256_castsi256_ps(_mm256_and_si256(r, normal));
    }
    e = _mm256_and_ps(e, live);
    _mm256_storeu_ps(sh + p, e);
    vsum[(p / 8) % 2] = _mm256_add_ps(vsum[(p / 8) % 2], e);
  }
  return 1.0f / SumHalves(vsum[0], vsum[1]);
}

// 8 elements of a K or V row as floats: `live` of them (fewer than 8 only at the end of a row
// whose head_dim is not a multiple of 8), the rest zeros.
inline __m256 LoadRow8(const float* at, int live) { return LoadTail(at, live); }
inline __m256 LoadRow8(const uint16_t* at, int live) {
  __m128i raw;
  if (live >= 8) {
    raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(at));
  } else {
    alignas(16) uint16_t part[8] = {};
    std::memcpy(part, at, sizeof(uint16_t) * live);
    raw = _mm_load_si128(reinterpret_cast<const __m128i*>(part));
  }
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

// acc[h][0, hd) += the weighted sum of the V rows rows[0, n) (positions p0, p0 + 1, ...;
// weights scores[h * stride + p0 + i]), G heads; acc rows of 16 * kMaxHeadChunks floats,
// 32-byte aligned. In position order, or (kPairs, a BF16 cache; p0 even) pair by pair, the odd
// position first, a missing odd position (n odd: the end of the context) adding 0 x 0. Between
// 8-column chunks the accumulators wait in acc (storing a float changes nothing), so the caller
// may split the positions into blocks that stay in L1 across the chunks. Each chunk first
// prefetches its share of `ahead` (the next block's lines) into L1: a share before each chunk
// rather than the whole block's lines at once, and not inside the chunk's loop, where GCC
// then keeps less in registers (measured: docs/kernels.md, "Attention: the avx2 V sum's
// prefetch shares").
template <int G, bool kPairs, typename Elem>
void AddValueRows(const Elem* const* rows, int n, int64_t p0, const float* scores, int64_t stride,
                  int hd, float (*acc)[16 * internal::kMaxHeadChunks], LineStream<Elem>& ahead) {
  const int chunks = (hd + 7) / 8;
  const int lines = static_cast<int>(static_cast<int64_t>(n) * hd * sizeof(Elem) / 64) + 1;
  const int share = (lines + chunks - 1) / chunks;
  const float* sh[G];
  for (int h = 0; h < G; ++h) sh[h] = scores + h * stride + p0;
  auto chunk = [&](int c, auto full) {
    const int live = full.value ? 8 : hd - c;
    for (int i = 0; i < share; ++i) ahead.template Prefetch<_MM_HINT_T0>();
    __m256 a[G];
    for (int h = 0; h < G; ++h) a[h] = _mm256_load_ps(acc[h] + c);
    auto add_row = [&](int i) {
      const __m256 vc = LoadRow8(rows[i] + c, live);
      for (int h = 0; h < G; ++h) a[h] = _mm256_fmadd_ps(_mm256_set1_ps(sh[h][i]), vc, a[h]);
    };
    InSumOrder<kPairs>(n, add_row, [&] {
      for (int h = 0; h < G; ++h) a[h] = _mm256_add_ps(a[h], _mm256_setzero_ps());
    });
    for (int h = 0; h < G; ++h) _mm256_store_ps(acc[h] + c, a[h]);
  };
  int c = 0;
  for (; c + 8 <= hd; c += 8) chunk(c, std::true_type());
  if (c < hd) chunk(c, std::false_type());
}

// out[h] = acc[h] * inv_sum[h] for G heads.
void StoreOutputs(float (*acc)[16 * internal::kMaxHeadChunks], const float* inv_sum, int heads,
                  int hd, float* out) {
  for (int h = 0; h < heads; ++h) {
    for (int c = 0; c < hd; c += 8) {
      StoreTail(out + h * hd + c, hd - c,
                _mm256_mul_ps(_mm256_load_ps(acc[h] + c), _mm256_set1_ps(inv_sum[h])));
    }
  }
}

// Positions of V summed per block: a block's rows (8 KB of BF16 at head_dim 64) stay in L1
// while every 8-column chunk passes over them.
constexpr int kValueBlock = 64;

// Calls fn(std::integral_constant<int, G>) for G = g (1..kMaxGroup): the accumulators of a
// group are a template argument, so that they stay in registers.
template <typename Fn>
void WithGroup(int g, Fn&& fn) {
  switch (g) {
    case 1:
      return fn(std::integral_constant<int, 1>());
    case 2:
      return fn(std::integral_constant<int, 2>());
    case 3:
      return fn(std::integral_constant<int, 3>());
    case 4:
      return fn(std::integral_constant<int, 4>());
    case 5:
      return fn(std::integral_constant<int, 5>());
    case 6:
      return fn(std::integral_constant<int, 6>());
    case 7:
      return fn(std::integral_constant<int, 7>());
    default:
      return fn(std::integral_constant<int, 8>());
  }
}
static_assert(kMaxGroup == 8, "WithGroup covers 1..kMaxGroup");

// Positions per key tile: one 8-lane score vector (the avx512 path's tile holds 16).
constexpr int kKeyTile = 8;
// Key tiles prefetched ahead of the one being widened (~4 KB of BF16 rows at head_dim 64).
constexpr int kKeyTilesAhead = 4;

// Eight whole BF16 columns [c0, c0 + 8) of 8 rows, widened and transposed: v[i] holds column
// c0 + i of rows 0..7. Rows r and r + 4 share a register, so 4 unpacks of 16 bits and 4 of 32
// transpose both halves at once, and unpacking with zeros widens (a BF16 value is the high half
// of its F32): 20 shuffles where widening first and transposing F32 takes 40.
inline void WidenTransposeBF16(const uint16_t* const* rows, int c0, __m256 (&v)[8]) {
  __m256i y[4];
  for (int i = 0; i < 4; ++i) {
    y[i] = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[i] + c0))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[i + 4] + c0)), 1);
  }
  // Per 128-bit half: a[0] rows 0,1 (4,5) interleaved for columns 0-3, a[1] for 4-7; a[2], a[3]
  // rows 2,3 (6,7). b[j]: rows 0-3 (4-7) of columns 2j and 2j + 1.
  const __m256i a[4] = {_mm256_unpacklo_epi16(y[0], y[1]), _mm256_unpackhi_epi16(y[0], y[1]),
                        _mm256_unpacklo_epi16(y[2], y[3]), _mm256_unpackhi_epi16(y[2], y[3])};
  const __m256i b[4] = {_mm256_unpacklo_epi32(a[0], a[2]), _mm256_unpackhi_epi32(a[0], a[2]),
                        _mm256_unpacklo_epi32(a[1], a[3]), _mm256_unpackhi_epi32(a[1], a[3])};
  const __m256i zero = _mm256_setzero_si256();
  for (int j = 0; j < 4; ++j) {
    v[2 * j] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, b[j]));
    v[2 * j + 1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, b[j]));
  }
}

// A BF16 row of zeros (head_dim <= 16 * kMaxHeadChunks) for the positions of a key tile past
// the context (their pages may not exist).
alignas(32) constexpr uint16_t kZeroRow[16 * internal::kMaxHeadChunks] = {};

// Widens the K rows of positions [p0, p0 + kKeyTile) and transposes them into tile [hd][8];
// positions from ctx on are zeros.
template <typename Elem>
void KeyTile(const internal::HeadPages& kv, int64_t p0, int64_t ctx, int hd, float* tile) {
  static_assert(kKeyTile == 8, "one 8 x 8 transpose per 8 columns");
  const Elem* rows[8];
  PageCursor<Elem> cursor(kv.k, kv.page_tokens, hd, p0);
  const int live = static_cast<int>(Min<int64_t>(8, ctx - p0));
  cursor.Take(live, rows);
  for (int r = live; r < 8; ++r) rows[r] = nullptr;
  int c0 = 0;
  if constexpr (sizeof(Elem) == sizeof(uint16_t)) {
    const uint16_t* whole[8];
    for (int r = 0; r < 8; ++r) whole[r] = rows[r] != nullptr ? rows[r] : kZeroRow;
    for (; c0 + 8 <= hd; c0 += 8) {
      __m256 v[8];
      WidenTransposeBF16(whole, c0, v);
      for (int i = 0; i < 8; ++i) _mm256_store_ps(tile + (c0 + i) * 8, v[i]);
    }
  }
  for (; c0 < hd; c0 += 8) {
    const int live = Min(8, hd - c0);
    __m256 v[8];
    for (int r = 0; r < 8; ++r) {
      v[r] = rows[r] != nullptr ? LoadRow8(rows[r] + c0, live) : _mm256_setzero_ps();
    }
    Transpose8x8(v);
    if (live == 8) {  // a fixed count: GCC turns the variable loop into a slow rep movs
      for (int i = 0; i < 8; ++i) _mm256_store_ps(tile + (c0 + i) * 8, v[i]);
    } else {
      for (int i = 0; i < live; ++i) _mm256_store_ps(tile + (c0 + i) * 8, v[i]);
    }
  }
}

template <typename Elem>
void AttendPagesOf(const internal::PageQuery* queries, int count, const internal::HeadPages& kv,
                   int hd, float scale, int heads, float* scores) {
  int64_t ctx = 0;
  for (int r = 0; r < count; ++r) {
    if (queries[r].ctx > ctx) ctx = queries[r].ctx;
  }
  const int64_t stride = (ctx + 15) / 16 * 16;
  // Scores: the key tile of each 8 positions serves every query of the run and every head.
  alignas(32) float tile[16 * internal::kMaxHeadChunks * 8];
  for (int64_t p0 = 0; p0 < ctx; p0 += 8) {
    const int64_t ahead = p0 + kKeyTilesAhead * kKeyTile;
    PrefetchRows<Elem>(kv.k, kv.page_tokens, hd, Min(ahead, ctx), Min(ahead + 8, ctx));
    KeyTile<Elem>(kv, p0, ctx, hd, tile);
    for (int r = 0; r < count; ++r) {
      if (queries[r].ctx <= p0) continue;
      float* sr = scores + static_cast<int64_t>(r) * heads * stride;
      for (int h = 0; h < heads;) {
        const int g = Min(kMaxGroup, heads - h);
        WithGroup(g, [&](auto group) {
          ScoreVector<group.value, sizeof(Elem) == sizeof(uint16_t)>(
              queries[r].q + h * hd, tile, 8, hd, scale, sr + h * stride, stride, p0);
        });
        h += g;
      }
    }
  }
  // Softmax and the weighted V sum, per query and group of heads, V in blocks of positions.
  constexpr bool kBF16 = sizeof(Elem) == sizeof(uint16_t);
  alignas(32) float acc[kMaxGroup][16 * internal::kMaxHeadChunks];
  const Elem* rows[kValueBlock];
  for (int r = 0; r < count; ++r) {
    const int64_t qctx = queries[r].ctx;
    for (int h = 0; h < heads;) {
      const int g = Min(kMaxGroup, heads - h);
      const float* sh = scores + (static_cast<int64_t>(r) * heads + h) * stride;
      float inv_sum[kMaxGroup];
      for (int i = 0; i < g; ++i) {
        inv_sum[i] = SoftmaxNumerators<kBF16>(
            scores + (static_cast<int64_t>(r) * heads + h + i) * stride, qctx);
        std::memset(acc[i], 0, sizeof(acc[i]));
      }
      PageCursor<Elem> cursor(kv.v, kv.page_tokens, hd, 0);
      for (int64_t p0 = 0; p0 < qctx; p0 += kValueBlock) {
        const int n = static_cast<int>(Min<int64_t>(kValueBlock, qctx - p0));
        cursor.Take(n, rows);
        LineStream<Elem> ahead(kv.v, kv.page_tokens, hd, p0 + n, Min(qctx, p0 + n + kValueBlock));
        WithGroup(g, [&](auto group) {
          AddValueRows<group.value, kBF16>(rows, n, p0, sh, stride, hd, acc, ahead);
        });
      }
      StoreOutputs(acc, inv_sum, g, hd, queries[r].out + h * hd);
      h += g;
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
const KernelTable kAvx2Kernels = {
    .name = "avx2",
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
