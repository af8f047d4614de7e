// The avx512 kernel path: AVX-512F/BW/VL/DQ with BF16 dot products (vdpbf16ps) and, for INT8,
// integer dot products (AVX512-VNNI's vpdpbusd); attention over
// the pages is in kernels_avx512_attention.cc. These two files alone are compiled with those flags;
// dispatch.cc runs it only on a CPU (and OS) that has them. See kernel_table.h for the rule that
// keeps its code out of the other paths.
#include "kernels/kernel_table.h"

// GCC 12's AVX-512 headers build some intrinsics from _mm*_undefined_*() values, which
// -Wuninitialized reports inside the header; the values are overwritten, so silence it here.
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cstring>
#include <utility>

namespace pdserve::kernels {
namespace {

using internal::kBlockCols;
using internal::kBlockGroups;
using internal::kGroupCols;
using internal::kPairElems;
using internal::kRows;
using internal::kTokens;

#include "kernels/avx512_common.inc"

// Tile shape of the matrix products: kTokens activation rows x kRows weight rows (F32) or
// 4 x 16 packed columns (BF16), one accumulator each (24 of the 32 zmm registers).

// Horizontal sums of 16 vectors at once: lane i of the result is the sum of the lanes of v[i].
// A transposing tree (four shuffle-and-add rounds for all 16 sums instead of four rounds per
// sum). Each sum is formed in the same order whatever its neighbours: lane i + lane i+8, then
// +4, +2, +1, the tree of _mm512_reduce_add_ps. Callers rely on that for batch invariance:
// a value does not depend on which other sums shared the call. Clobbers v.
inline __m512 HorizontalSums16(__m512 (&v)[16]) {
  // Round 1: lane i + lane i+8; v[2j] and v[2j+1] share a vector (256 bits each).
  for (int j = 0; j < 8; ++j) {
    v[j] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  // Round 2: +4; vector m holds sums 4m..4m+3, one per 128-bit quarter.
  for (int j = 0; j < 4; ++j) {
    v[j] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  }
  // Round 3: +2, within each quarter.
  for (int j = 0; j < 2; ++j) {
    v[j] = _mm512_add_ps(_mm512_shuffle_ps(v[2 * j], v[2 * j + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(v[2 * j], v[2 * j + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  // Round 4: +1. Lane 4q + j now holds the sum of v[4j + q]; a permutation restores order.
  const __m512 sums = _mm512_add_ps(_mm512_shuffle_ps(v[0], v[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm512_shuffle_ps(v[0], v[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, sums);
}

// Writes the horizontal sums of a tile's accumulators, acc[r][t] -> y[t0 + t][r0 + r].
template <int R, int T>
inline void StoreTile(const __m512 (&acc)[R][T], float* y, int n, int r0, int t0) {
  constexpr int kCount = R * T;
  for (int g = 0; g < kCount; g += 16) {
    const int live = Min(16, kCount - g);
    __m512 v[16];
    for (int i = 0; i < 16; ++i) {
      const int idx = g + i;
      v[i] = i < live ? acc[idx % R][idx / R] : _mm512_setzero_ps();
    }
    alignas(64) float sums[16];
    _mm512_store_ps(sums, HorizontalSums16(v));
    for (int i = 0; i < live; ++i) {
      const int idx = g + i;
      y[static_cast<size_t>(t0 + idx / R) * n + r0 + idx % R] = sums[i];
    }
  }
}

template <int R, int T>
struct TileF32 {
  static void Run(const float* x, const float* w, float* y, int n, int k, int r0, int t0);
};
template <int R, int T>
void TileF32<R, T>::Run(const float* x, const float* w, float* y, int n, int k, int r0, int t0) {
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  const float* wr[R];
  const float* xt[T];
  for (int r = 0; r < R; ++r) wr[r] = w + static_cast<size_t>(r0 + r) * k;
  for (int t = 0; t < T; ++t) xt[t] = x + static_cast<size_t>(t0 + t) * k;
  for (int kk = 0; kk < k; kk += 16) {
    __mmask16 mask = TailMask16(k - kk);
    __m512 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = _mm512_maskz_loadu_ps(mask, wr[r] + kk);
    for (int t = 0; t < T; ++t) {
      __m512 xv = _mm512_maskz_loadu_ps(mask, xt[t] + kk);
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(xv, wv[r], acc[r][t]);
    }
  }
  StoreTile<R, T>(acc, y, n, r0, t0);
}

using TileF32Fn = void (*)(const float*, const float*, float*, int, int, int, int);

// Tiles of every token count 1..kTokens, so that the weight rows of a block are read once per
// token block whatever the batch size (a 2-token decode step must not read weights twice).
template <int R, size_t... T>
constexpr Array<TileF32Fn, kTokens + 1> TileF32Table(std::index_sequence<T...>) {
  return {nullptr, &TileF32<R, static_cast<int>(T) + 1>::Run...};
}

// Walks a product's tiles: weight blocks in parallel, token blocks of kTokenBlock rows in

// ---- BF16 products over packed weights (layout: kernel_table.h) ----
//
// Each group of the packed layout is exactly the operand vdpbf16ps multiplies a broadcast pair
// of x values with, so a block streams from memory as one contiguous run.
// Software prefetch along a block's contiguous stream (the hardware prefetchers stop at every
// 4 KB page). Tiles of at least kPrefetchMinTokens rows are compute-heavy and leave the
// hardware behind: they fetch every line of a pair 4 KB ahead. A tile of one to three rows is a
// pure stream: every line of a pair 2 KB ahead. Every line, since the adjacent-line prefetcher
// did not cover the rest in time on every host (measured: docs/kernels.md, "Products: prefetch
// along a weight block").
constexpr int kPrefetchPairs = 16;
constexpr int kStreamPrefetchPairs = 8;
constexpr int kPrefetchMinTokens = 4;

// One tile: G groups of 16 columns of one block x T rows of x.
template <int G, int T>
struct TilePacked {
  static void Run(const uint16_t* x, const uint16_t* block, float* y, int n, int k, int c0, int t0,
                  internal::BlockAhead ahead);
};
template <int G, int T>
void TilePacked<G, T>::Run(const uint16_t* x, const uint16_t* block, float* y, int n, int k, int c0,
                           int t0, internal::BlockAhead ahead) {
  __m512 acc[G][T];
  for (int g = 0; g < G; ++g)
    for (int t = 0; t < T; ++t) acc[g][t] = _mm512_setzero_ps();
  const uint16_t* xt[T];
  for (int t = 0; t < T; ++t) xt[t] = x + static_cast<size_t>(t0 + t) * k;
  // One k pair: the broadcast pair x[t][2p], x[t][2p+1] of every row times 4 x 16 columns.
  auto step = [&](int p, auto pair_bits) {
    const uint16_t* wp = block + static_cast<size_t>(p) * kPairElems;
    // The block's stream is contiguous: fetch its lines well ahead of use (the hardware
    // prefetchers stop at every 4 KB page).
    if constexpr (T >= kPrefetchMinTokens) {
      for (int g = 0; g < G; ++g) {
        _mm_prefetch(reinterpret_cast<const char*>(wp + kPrefetchPairs * kPairElems + 32 * g),
                     _MM_HINT_T0);
      }
    } else {
      for (int g = 0; g < G; ++g) {
        _mm_prefetch(reinterpret_cast<const char*>(wp + kStreamPrefetchPairs * kPairElems + 32 * g),
                     _MM_HINT_T0);
      }
    }
    __m512bh wv[G];
    for (int g = 0; g < G; ++g) wv[g] = (__m512bh)_mm512_loadu_si512(wp + 32 * g);
    for (int t = 0; t < T; ++t) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair_bits(xt[t], p)));
      for (int g = 0; g < G; ++g) acc[g][t] = _mm512_dpbf16_ps(acc[g][t], xv, wv[g]);
    }
  };
  // The next block's share (BlockAhead), into L2 a line at a time, evenly over the k pairs: a
  // Bresenham count of `lines` per `pairs`.
  const char* ahead_line = static_cast<const char*>(ahead.at);
  const int64_t ahead_lines = ahead.at != nullptr ? (ahead.bytes + 63) / 64 : 0;
  const int64_t pairs = internal::Pairs(k);
  int64_t owed = 0;
  const int full_pairs = k / 2;
  for (int p = 0; p < full_pairs; ++p) {
    for (owed += ahead_lines; owed >= pairs; owed -= pairs) {
      _mm_prefetch(ahead_line, _MM_HINT_T1);
      ahead_line += 64;
    }
    step(p, [](const uint16_t* row, int q) {
      uint32_t bits;
      std::memcpy(&bits, row + 2 * q, sizeof(bits));
      return bits;
    });
  }
  if (k % 2 != 0) {  // the last pair holds one value; its partner is zero
    step(full_pairs, [](const uint16_t* row, int q) { return uint32_t{row[2 * q]}; });
  }
  for (int t = 0; t < T; ++t) {
    float* yr = y + static_cast<size_t>(t0 + t) * n + c0;
    for (int g = 0; g < G; ++g) {
      _mm512_mask_storeu_ps(yr + kGroupCols * g, TailMask16(n - c0 - kGroupCols * g), acc[g][t]);
    }
  }
}

using PackedTileFn = void (*)(const uint16_t*, const uint16_t*, float*, int, int, int, int,
                              internal::BlockAhead);

template <int G, size_t... T>
constexpr Array<PackedTileFn, kTokens + 1> PackedTiles(std::index_sequence<T...>) {
  return {nullptr, &TilePacked<G, static_cast<int>(T) + 1>::Run...};
}

template <size_t... G>
constexpr Array<Array<PackedTileFn, kTokens + 1>, kBlockGroups + 1> PackedTileTable(
    std::index_sequence<G...>) {
  return {Array<PackedTileFn, kTokens + 1>{},
          PackedTiles<static_cast<int>(G) + 1>(std::make_index_sequence<kTokens>())...};
}

// The 8-bit layouts put a head (scales) of `head_bytes` before each k block's lines, and their
// one-row tiles prefetch `ahead` bytes past the line they read: the stream of the k block before
// stopped `ahead` bytes past its own last line, short by the head of the lines `ahead` bytes
// into this block's (`lines`). Fetches those at the block's start (else each is a demand miss).
// Always inlined: a prefetch-only function compiled on its own is "const" to GCC's IPA, which
// deletes its calls (kernels.md, page_rows.inc's PrefetchRows).
__attribute__((always_inline)) inline void PrefetchPastHead(const uint8_t* lines, int ahead,
                                                            int head_bytes) {
  for (int at = ahead - head_bytes; at < ahead; at += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(lines + at), _MM_HINT_T0);
  }
}

#include "kernels/kernels_avx512_fp8.inc"
#include "kernels/kernels_avx512_int8.inc"

// F32ToBF16 of n values on the calling thread, 16 lanes at a time (bit for bit: round to
// nearest even, NaN stays NaN).
void ToBF16Run(const float* src, uint16_t* dst, int64_t n) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  const __m512i inf = _mm512_set1_epi32(0x7f800000);
  const __m512i bias = _mm512_set1_epi32(0x7fff);
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i quiet = _mm512_set1_epi32(0x00400000);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask = TailMask16(static_cast<int>(Min<int64_t>(16, n - i)));
    const __m512i u = _mm512_maskz_loadu_epi32(mask, src + i);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(bias, lsb));
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(u, quiet));
    _mm256_mask_storeu_epi16(dst + i, mask, _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
  }
}

// vcvtneps2bf16 itself (kernel_table.h's to_bf16_daz).
void ToBF16Daz(const float* src, float factor, uint16_t* dst, int64_t n) {
  const __m512 f = _mm512_set1_ps(factor);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask = TailMask16(static_cast<int>(Min<int64_t>(16, n - i)));
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, src + i), f);
    _mm256_mask_storeu_epi16(dst + i, mask, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
  }
}

void PackedTile(const uint16_t* x, const uint16_t* block, float* y, int n, int k, int c0, int t0,
                int groups, int tokens, internal::BlockAhead ahead) {
  static constexpr auto kTiles = PackedTileTable(std::make_index_sequence<kBlockGroups>());
  kTiles[groups][tokens](x, block, y, n, k, c0, t0, ahead);
}

void F32Tile(const float* x, const float* w, float* y, int n, int k, int r0, int t0, int rows,
             int tokens) {
  static constexpr auto kBlockTiles = TileF32Table<kRows>(std::make_index_sequence<kTokens>());
  static constexpr auto kRowTiles = TileF32Table<1>(std::make_index_sequence<kTokens>());
  if (rows == kRows) {
    kBlockTiles[tokens](x, w, y, n, k, r0, t0);
  } else {
    for (int r = r0; r < r0 + rows; ++r) kRowTiles[tokens](x, w, y, n, k, r, t0);
  }
}

void RmsNormRow(const float* xr, const float* weight, float* yr, int dim, float eps) {
  __m512 acc = _mm512_setzero_ps();
  for (int i = 0; i < dim; i += 16) {
    __m512 v = _mm512_maskz_loadu_ps(TailMask16(dim - i), xr + i);
    acc = _mm512_fmadd_ps(v, v, acc);
  }
  const float inv = 1.0f / __builtin_sqrtf(_mm512_reduce_add_ps(acc) / dim + eps);
  for (int i = 0; i < dim; ++i) yr[i] = xr[i] * inv * weight[i];
}

#include "kernels/kernels_scalar.inc"

void SiluMul(const float* gate, const float* up, float* out, int n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int i = 0; i < n; i += 16) {
    __mmask16 mask = TailMask16(n - i);
    __m512 g = _mm512_maskz_loadu_ps(mask, gate + i);
    __m512 u = _mm512_maskz_loadu_ps(mask, up + i);
    __m512 e = Exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
    __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, e));
    _mm512_mask_storeu_ps(out + i, mask, _mm512_mul_ps(silu, u));
  }
}

}  // namespace

namespace internal {
const KernelTable kAvx512Kernels = {
    .name = "avx512",
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
    .attend_pages = internal::Avx512AttendPages,
};
}  // namespace internal

}  // namespace pdserve::kernels
