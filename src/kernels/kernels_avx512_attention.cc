// The avx512 path's attention straight from the KV pages (KernelTable::attend_pages): compiled
// with the same flags as kernels_avx512.cc, whose kernel table points at Avx512AttendPages.
#include "kernels/kernel_table.h"

// GCC 12's AVX-512 headers build some intrinsics from _mm*_undefined_*() values, which
// -Wuninitialized reports inside the header; the values are overwritten, so silence it here.
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cstring>
#include <utility>

namespace pdserve::kernels {
namespace {

using internal::kMaxGroup;
using internal::kMaxHeadChunks;

#include "kernels/avx512_common.inc"

// scores [0, ctx) -> exp(score - max) in place, 16 positions at a time; returns 1 / their sum
// (16 lanes by position mod 16, then the lane tree). Whole vectors go without masks, only a
// partial last one with (SoftmaxNumerators' maximum too), since masks cost on every vector
// (measured: docs/kernels.md, "Attention: the softmax loops without masks"). An F32 cache's
// numerators.
float ExpInPlace(float* sh, int64_t ctx, float max) {
  const __m512 vm = _mm512_set1_ps(max);
  __m512 vsum = _mm512_setzero_ps();
  int64_t p = 0;
  for (; p + 16 <= ctx; p += 16) {
    const __m512 e = Exp512(_mm512_sub_ps(_mm512_loadu_ps(sh + p), vm));
    _mm512_storeu_ps(sh + p, e);
    vsum = _mm512_add_ps(vsum, e);
  }
  if (p < ctx) {
    const __mmask16 mask = TailMask16(static_cast<int>(ctx - p));
    const __m512 e =
        _mm512_maskz_mov_ps(mask, Exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, sh + p), vm)));
    _mm512_mask_storeu_ps(sh + p, mask, e);
    vsum = _mm512_add_ps(vsum, e);
  }
  return 1.0f / _mm512_reduce_add_ps(vsum);
}

// A BF16 cache's numerators: exp(score - max) converted to BF16 by vcvtneps2bf16 (nearest even,
// a denormal weighs 0: the generic path's WeightBF16), written as BF16 over the scores' own
// memory (position p's at byte 2p, over scores already read) and zero up to the next
// even position, so that the V sum reads each pair of positions' weights as one 32-bit word;
// returns 1 / the sum of the BF16 values (the lanes as ExpInPlace). One conversion here is
// cheaper than rounding in integer steps and converting each value block's weights again for
// the V sum (measured: docs/kernels.md, "Attention: BF16 numerators written once").
float ExpToBF16InPlace(float* sh, int64_t ctx, float max) {
  uint16_t* weights = reinterpret_cast<uint16_t*>(sh);
  const __m512 vm = _mm512_set1_ps(max);
  __m512 vsum = _mm512_setzero_ps();
  auto widen = [](__m256bh b) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)b), 16));
  };
  int64_t p = 0;
  for (; p + 16 <= ctx; p += 16) {
    const __m256bh b = _mm512_cvtneps_pbh(Exp512(_mm512_sub_ps(_mm512_loadu_ps(sh + p), vm)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(weights + p), (__m256i)b);
    vsum = _mm512_add_ps(vsum, widen(b));
  }
  if (p < ctx) {
    const int live = static_cast<int>(ctx - p);
    const __mmask16 mask = TailMask16(live);
    const __m512 e = Exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, sh + p), vm));
    const __m256bh b = (__m256bh)_mm256_maskz_mov_epi16(mask, (__m256i)_mm512_cvtneps_pbh(e));
    _mm256_mask_storeu_epi16(weights + p, TailMask16(live + 1), (__m256i)b);
    vsum = _mm512_add_ps(vsum, widen(b));
  }
  return 1.0f / _mm512_reduce_add_ps(vsum);
}

// ---- Attention straight from the pages (KernelTable::attend_pages) ----
//
// The generic path's values, bit for bit (kernel_table.h): a score is one lane per position
// summing q . k over d in order (FMA) and then scaled; the softmax maximum and sum take 16 lanes
// (position mod 16) and the lane tree; each element of the V sum adds its positions in order.
// K is transposed 16 positions (a key tile) at a time for every query and head of the run: over
// a BF16 cache two tiles at a time into words in L1 (PassScores), over an F32 cache in
// registers, a block of head_dim at a time (TileScoresF32); V rows are used as they load.

// Positions per key tile: one 16-lane score vector (the avx2 path's tile holds 8, its width).
constexpr int kKeyTile = 16;
// Software prefetch: the K rows of the key tile kKeyTilesAhead tiles ahead into L1 and
// kTilesAheadL2 tiles ahead into L2 while the scores are computed; the V rows kValueBlocksAhead
// value blocks ahead into L2 and the next value block into L1 while V is summed (its first
// blocks during the softmax). A tile is one page slice of 16 tokens at head_dim 64 (2 KB of
// BF16), too short for the hardware prefetchers to train on. K and V come in different phases:
// one core cannot keep enough misses in flight for both streams at once.
//
// Over a BF16 cache the prefetches are paced: the loops that multiply (the word loop of the
// scores, the pair loop of the V sum) each issue two lines into L1 and two into L2 an
// iteration from LineStreams, which is the rate that covers a pass's (a block's) lines by its
// end at any head_dim; bursts of prefetches before each pass and block were slower. Measured
// (these distances, pacing, the alternatives): docs/kernels.md, "Attention: prefetch distances
// and pacing".
constexpr int kKeyTilesAhead = 2;
constexpr int kTilesAheadL2 = 4;
// Positions of V summed per block: a block (8 KB at head_dim 64 in BF16) stays in L1 while
// every chunk pass goes over it.
constexpr int kValueBlock = 64;
constexpr int kValueBlocksAhead = 2;
// An F32 cache's 16-column chunks of head_dim summed in one pass over a block: up to kMaxGroup
// heads x 2 chunks keep 16 accumulators, 2 V chunks and a score broadcast in registers (a
// BF16 cache's pass covers 32 elements, AddValuePairs).
constexpr int kPassChunks = 2;

// A zero row (head_dim <= 16 * kMaxHeadChunks) for the positions of a key tile past the
// context, whose pages may not exist, and the partner of an odd last V row (SumValuePairs).
alignas(64) constexpr float kZeroRow[16 * kMaxHeadChunks] = {};

#include "kernels/page_rows.inc"

// While the V block before position `next` is summed: the block from `next` into L1 and the
// one kValueBlocksAhead blocks past the summed one into L2 (those between are on their way).
template <typename Elem>
[[gnu::always_inline]] inline void PrefetchValueBlocks(const internal::HeadPages& kv, int64_t ctx,
                                                       int hd, int64_t next) {
  PrefetchRows<Elem>(kv.v, kv.page_tokens, hd, next, Min(ctx, next + kValueBlock));
  const int64_t far = Min(ctx, next + (kValueBlocksAhead - 1) * kValueBlock);
  PrefetchRows<Elem, _MM_HINT_T1>(kv.v, kv.page_tokens, hd, far, Min(ctx, far + kValueBlock));
}

// One stage of an in-register 16 x 16 transpose: within every 2B x 2B block, swaps the
// off-diagonal B x B blocks (row i, lanes with bit B set <-> row i + B, lanes with bit B clear).
template <int B>
inline void TransposeStage(__m512 (&v)[16]) {
  alignas(64) static constexpr auto kIndex = [] {
    Array<Array<int32_t, 16>, 2> idx{};  // permutex2var: 0-15 first row, 16-31 second
    for (int l = 0; l < 16; ++l) {
      idx[0][l] = (l & B) != 0 ? 16 + l - B : l;
      idx[1][l] = (l & B) != 0 ? 16 + l : l + B;
    }
    return idx;
  }();
  const __m512i lo = _mm512_load_si512(kIndex[0].v);
  const __m512i hi = _mm512_load_si512(kIndex[1].v);
  for (int i = 0; i < 16; ++i) {
    if ((i & B) != 0) continue;
    const __m512 a = v[i], b = v[i + B];
    v[i] = _mm512_permutex2var_ps(a, lo, b);
    v[i + B] = _mm512_permutex2var_ps(a, hi, b);
  }
}

inline void Transpose16x16(__m512 (&v)[16]) {
  TransposeStage<8>(v);
  TransposeStage<4>(v);
  TransposeStage<2>(v);
  TransposeStage<1>(v);
}

// rows[0, 16) -> v[w] lane i: 32-bit word w of row i's block at element c0 (BF16: elements
// c0 + 2w, c0 + 2w + 1; F32: element c0 + w). `mask` covers the block's live elements; the
// others are zeros.
//
// A whole BF16 block (32 elements) is loaded 16 bytes at a time, so that the loads do the first
// half of the transpose: v[4x + y]'s 128-bit lane l is words [4x, 4x + 4) of row 4l + y, and
// only the 4 x 4 transposes inside the lanes are left to the shuffles (32 instead of 64). The
// same words, faster from memory (measured, with the masked-broadcast alternative:
// docs/kernels.md, "Attention: loads that do half of the key transpose").
inline void LoadBlockBF16(const uint16_t* const* rows, int c0, __mmask32 mask, __m512 (&v)[16]) {
  if (mask == ~__mmask32{0}) {
    for (int x = 0; x < 4; ++x) {
      for (int y = 0; y < 4; ++y) {
        auto quarter = [&](int l) {
          return _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[4 * l + y] + c0 + 8 * x));
        };
        __m512i lanes = _mm512_castsi128_si512(quarter(0));
        lanes = _mm512_inserti32x4(lanes, quarter(1), 1);
        lanes = _mm512_inserti32x4(lanes, quarter(2), 2);
        lanes = _mm512_inserti32x4(lanes, quarter(3), 3);
        v[4 * x + y] = _mm512_castsi512_ps(lanes);
      }
    }
    TransposeStage<2>(v);
    TransposeStage<1>(v);
    return;
  }
  for (int r = 0; r < 16; ++r) {
    v[r] = _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(mask, rows[r] + c0));
  }
  Transpose16x16(v);
}
inline void LoadBlockF32(const float* const* rows, int c0, __mmask16 mask, __m512 (&v)[16]) {
  for (int r = 0; r < 16; ++r) v[r] = _mm512_maskz_loadu_ps(mask, rows[r] + c0);
  Transpose16x16(v);
}

// ---- Scores over an F32 cache, straight from the K rows ----
//
// A block of 16 columns of a key tile's rows is loaded and transposed in registers
// (LoadBlockF32), and every query and head of the run multiplies it while it is there, so the
// transposed keys never go through memory. Across blocks a score's sum waits in the scores
// array (storing a float changes nothing): the sum over d stays in order.

// One query's G heads over the block's `live` elements from d0: scores[h * stride, + 16) holds
// head h's sums so far (`first`: none yet); on the `last` block they are scaled. q: the heads'
// rows of PageQuery::q (hd values each).
template <int G, bool kFull>
[[gnu::always_inline]] inline void BlockScores(const __m512 (&v)[16], int live, const float* q,
                                               int hd, int d0, float* scores, int64_t stride,
                                               bool first, bool last, float scale) {
  __m512 acc[G];
  for (int h = 0; h < G; ++h) {
    acc[h] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(scores + h * stride);
  }
  const float* qf = q + d0;
  const int n = kFull ? 16 : live;
#pragma GCC unroll 16
  for (int e = 0; e < n; ++e) {  // unrolled, so that every v[e] is a register
    for (int h = 0; h < G; ++h) {
      acc[h] = _mm512_fmadd_ps(_mm512_set1_ps(qf[h * hd + e]), v[e], acc[h]);
    }
  }
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int h = 0; h < G; ++h) {
    _mm512_storeu_ps(scores + h * stride, last ? _mm512_mul_ps(acc[h], vscale) : acc[h]);
  }
}

// BlockScores for g heads, 1 <= g <= kMaxGroup: a chain of comparisons the compiler inlines
// (a table of function pointers would pass the block through memory).
template <bool kFull, int... G>
[[gnu::always_inline]] inline void GroupBlockScores(std::integer_sequence<int, G...>, int g,
                                                    const __m512 (&v)[16], int live, const float* q,
                                                    int hd, int d0, float* scores, int64_t stride,
                                                    bool first, bool last, float scale) {
  (void)((g == G + 1
              ? (BlockScores<G + 1, kFull>(v, live, q, hd, d0, scores, stride, first, last, scale),
                 true)
              : false) ||
         ...);
}

// The scores of positions [p0, p0 + 16) (rows[i]: position p0 + i's K row, or a zero row past
// the context) for every query of the run that reaches p0 and every head.
void TileScoresF32(const float* const* rows, const internal::PageQuery* queries, int count, int hd,
                   float scale, int heads, int64_t p0, float* scores, int64_t stride) {
  for (int d0 = 0; d0 < hd; d0 += 16) {
    const int live = Min(16, hd - d0);
    __m512 v[16];
    LoadBlockF32(rows, d0, TailMask16(live), v);
    const bool first = d0 == 0, last = d0 + 16 >= hd;
    for (int r = 0; r < count; ++r) {
      if (queries[r].ctx <= p0) continue;
      float* sr = scores + static_cast<int64_t>(r) * heads * stride + p0;
      for (int h = 0; h < heads; h += kMaxGroup) {
        const int g = Min(kMaxGroup, heads - h);
        const float* q = queries[r].q + h * hd;
        constexpr auto kGroups = std::make_integer_sequence<int, kMaxGroup>();
        if (live == 16) {
          GroupBlockScores<true>(kGroups, g, v, live, q, hd, d0, sr + h * stride, stride, first,
                                 last, scale);
        } else {
          GroupBlockScores<false>(kGroups, g, v, live, q, hd, d0, sr + h * stride, stride, first,
                                  last, scale);
        }
      }
    }
  }
}

// ---- Scores over a BF16 cache: two key tiles at a time from transposed words in L1 ----
//
// The key tiles' rows are transposed (LoadBlockBF16) into words once, into an L1 buffer that
// every query and head of the run reads: word w of a tile is 16 positions' elements 2w, 2w + 1,
// the operand vdpbf16ps multiplies a broadcast q pair with. A pass over the words takes two
// tiles, so that each head keeps two independent chains of vdpbf16ps (2 x G in flight, more
// than the instruction's latency covers) and each q pair is broadcast once for both tiles; the
// words of both tiles and the accumulators fit in registers (2 x kMaxGroup + 3). A score sums
// its words in order in one register, then is scaled (the generic path's order). One tile's
// chains alone are bound by the instruction's latency (measured: docs/kernels.md, "Attention:
// two key tiles a pass").

// Words of the tiles of one pass: tile t, word w.
using TileWords = __m512[2][16 * kMaxHeadChunks / 2];

// rows[0, 16) (a key tile) -> words[0, (hd + 1) / 2).
inline void TransposeTileWords(const uint16_t* const* rows, int hd, __m512* words) {
  for (int d0 = 0; d0 < hd; d0 += 32) {
    const int live = Min(32, hd - d0);
    __m512 v[16];
    LoadBlockBF16(rows, d0, live >= 32 ? ~__mmask32{0} : (__mmask32{1} << live) - 1, v);
    if (live == 32) {  // unrolled, so that v stays in registers (a loop became a memcpy)
#pragma GCC unroll 16
      for (int w = 0; w < 16; ++w) _mm512_store_ps(words + d0 / 2 + w, v[w]);
    } else {
      for (int w = 0; w < (live + 1) / 2; ++w) _mm512_store_ps(words + d0 / 2 + w, v[w]);
    }
  }
}

// The lines a pass or a value block prefetches while it multiplies: the rows of `span`
// positions from `near` into L1 and from `far` into L2 (both cut at ctx), two lines of each an
// iteration of its loop.
struct AheadLines {
  AheadLines(const void* const* pages, int page_tokens, int hd, int64_t ctx, int64_t near_at,
             int64_t far_at, int64_t span)
      : near(pages, page_tokens, hd, near_at, Min(ctx, near_at + span)),
        far(pages, page_tokens, hd, far_at, Min(ctx, far_at + span)) {}

  LineStream<uint16_t> near, far;

  [[gnu::always_inline]] void Step() {
    near.Prefetch<_MM_HINT_T0>();
    near.Prefetch<_MM_HINT_T0>();
    far.Prefetch<_MM_HINT_T1>();
    far.Prefetch<_MM_HINT_T1>();
  }
};

// The scores of T tiles (16 positions each, 16 * T apart in `scores`) for G heads of one query:
// scores[h * stride + 16 t, + 16) = scale * (q pairs of head h . the words of tile t). q: the
// heads' pairs (PageQuery::q_bf16), rows of 2 * words values. Steps `ahead` once a word.
template <int G, int T>
[[gnu::always_inline]] inline void TileWordScores(const TileWords& tiles, int words,
                                                  const uint16_t* q, float* scores, int64_t stride,
                                                  float scale, AheadLines& ahead) {
  __m512 acc[T][G];
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < G; ++h) acc[t][h] = _mm512_setzero_ps();
  }
  for (int w = 0; w < words; ++w) {
    __m512bh k[T];
    for (int t = 0; t < T; ++t) k[t] = (__m512bh)_mm512_castps_si512(tiles[t][w]);
    ahead.Step();
    for (int h = 0; h < G; ++h) {
      uint32_t bits;
      std::memcpy(&bits, q + (h * words + w) * 2, sizeof(bits));
      const __m512bh pair = (__m512bh)_mm512_set1_epi32(static_cast<int>(bits));
      for (int t = 0; t < T; ++t) acc[t][h] = _mm512_dpbf16_ps(acc[t][h], k[t], pair);
    }
  }
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < G; ++h) {
      _mm512_storeu_ps(scores + h * stride + 16 * t, _mm512_mul_ps(acc[t][h], vscale));
    }
  }
}

// TileWordScores for g heads, 1 <= g <= kMaxGroup (a chain of comparisons the compiler
// inlines, as GroupBlockScores).
template <int T, int... G>
[[gnu::always_inline]] inline void GroupTileWordScores(std::integer_sequence<int, G...>, int g,
                                                       const TileWords& tiles, int words,
                                                       const uint16_t* q, float* scores,
                                                       int64_t stride, float scale,
                                                       AheadLines& ahead) {
  (void)((g == G + 1
              ? (TileWordScores<G + 1, T>(tiles, words, q, scores, stride, scale, ahead), true)
              : false) ||
         ...);
}

// The scores of positions [p0, p0 + 16 * T) for every query of the run that reaches p0 and
// every head, from the T tiles' words; the first query and group of heads issue the prefetches.
template <int T>
void PassScores(const TileWords& tiles, const internal::PageQuery* queries, int count, int hd,
                float scale, int heads, int64_t p0, float* scores, int64_t stride,
                AheadLines& ahead) {
  const int words = internal::QueryPairs(hd);
  for (int r = 0; r < count; ++r) {
    if (queries[r].ctx <= p0) continue;
    float* sr = scores + static_cast<int64_t>(r) * heads * stride + p0;
    for (int h = 0; h < heads; h += kMaxGroup) {
      const int g = Min(kMaxGroup, heads - h);
      GroupTileWordScores<T>(std::make_integer_sequence<int, kMaxGroup>(), g, tiles, words,
                             queries[r].q_bf16 + h * 2 * words, sr + h * stride, stride, scale,
                             ahead);
    }
  }
}

// Turns the scores [0, ctx) of one head into softmax numerators in place (over a BF16 cache,
// BF16 values in the first half of the bytes: ExpToBF16InPlace); returns 1 / their sum.
template <typename Elem>
float SoftmaxNumerators(float* sh, int64_t ctx) {
  __m512 vmax = _mm512_set1_ps(-__builtin_inff());
  int64_t p = 0;
  for (; p + 16 <= ctx; p += 16) vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(sh + p));
  if (p < ctx) {
    const __mmask16 mask = TailMask16(static_cast<int>(ctx - p));
    vmax = _mm512_mask_max_ps(vmax, mask, vmax, _mm512_maskz_loadu_ps(mask, sh + p));
  }
  const float max = _mm512_reduce_max_ps(vmax);
  if constexpr (sizeof(Elem) == sizeof(uint16_t)) return ExpToBF16InPlace(sh, ctx, max);
  return ExpInPlace(sh, ctx, max);
}

// Accumulators of a group of heads between blocks, one row of 16 * kMaxHeadChunks per head.
using HeadAccumulators = float (*)[16 * kMaxHeadChunks];

// An F32 cache's V sum: acc[h][16 * c0, + 16 * C) += scores of head h times the V rows
// rows[0, n), position by
// position in order (G heads, C <= 2 chunks; sh[h]: head h's numerators from the block's first
// position on); kTail: the last chunk is partial. Between blocks the accumulators wait in acc
// (storing a float changes nothing). Written so that GCC 12 keeps the accumulators in
// registers: it stored all of them to the stack on every row with a [G][C] array, with a loop
// over runs of pages, or with a masked load (a builtin that may read any memory) in the loop;
// only a partial last chunk needs the masked load.
template <int G, int C, bool kTail>
void AddValueRows(const float* const* rows, int n, const float* const* sh, int hd, int c0,
                  HeadAccumulators acc) {
  static_assert(C == 1 || C == 2);
  const __mmask16 tail = TailMask16(hd - 16 * (c0 + C - 1));
  __m512 a0[G], a1[G];
  for (int h = 0; h < G; ++h) {
    a0[h] = _mm512_load_ps(acc[h] + 16 * c0);
    if constexpr (C == 2) a1[h] = _mm512_load_ps(acc[h] + 16 * (c0 + 1));
  }
  for (int i = 0; i < n; ++i) {
    // A whole chunk, or (the partial last one) the lanes of `tail`, the others zero.
    const float* row = rows[i] + 16 * c0;
    const __m512 v0 = kTail && C == 1 ? _mm512_maskz_loadu_ps(tail, row) : _mm512_loadu_ps(row);
    __m512 v1 = _mm512_setzero_ps();
    if constexpr (C == 2) {
      v1 = kTail ? _mm512_maskz_loadu_ps(tail, row + 16) : _mm512_loadu_ps(row + 16);
    }
    for (int h = 0; h < G; ++h) {
      const __m512 s = _mm512_set1_ps(sh[h][i]);
      a0[h] = _mm512_fmadd_ps(s, v0, a0[h]);
      if constexpr (C == 2) a1[h] = _mm512_fmadd_ps(s, v1, a1[h]);
    }
  }
  for (int h = 0; h < G; ++h) {
    _mm512_store_ps(acc[h] + 16 * c0, a0[h]);
    if constexpr (C == 2) _mm512_store_ps(acc[h] + 16 * (c0 + 1), a1[h]);
  }
}

// kValueRows[tail][g][c]: AddValueRows<g, c, tail>.
using ValueRowsFn = void (*)(const float* const*, int, const float* const*, int, int,
                             HeadAccumulators);
template <bool kTail, size_t... G>
constexpr Array<Array<ValueRowsFn, 3>, kMaxGroup + 1> ValueRowsOf(std::index_sequence<G...>) {
  return {Array<ValueRowsFn, 3>{},
          Array<ValueRowsFn, 3>{nullptr, &AddValueRows<static_cast<int>(G) + 1, 1, kTail>,
                                &AddValueRows<static_cast<int>(G) + 1, 2, kTail>}...};
}

// An F32 cache's weighted V sum of g <= kMaxGroup heads over positions [0, ctx) into acc:
// blocks of kValueBlock positions, each passed over 2 chunks at a time while it sits in L1.
void SumValues(const internal::HeadPages& kv, int64_t ctx, int hd, const float* sh, int64_t stride,
               int g, HeadAccumulators acc) {
  static constexpr Array<Array<Array<ValueRowsFn, 3>, kMaxGroup + 1>, 2> kValueRows = {
      ValueRowsOf<false>(std::make_index_sequence<kMaxGroup>()),
      ValueRowsOf<true>(std::make_index_sequence<kMaxGroup>())};
  const int chunks = (hd + 15) / 16;
  const float* rows[kValueBlock];
  const float* rows_of[kMaxGroup];
  PageCursor<float> cursor(kv.v, kv.page_tokens, hd, 0);
  for (int64_t p0 = 0; p0 < ctx; p0 += kValueBlock) {
    const int n = static_cast<int>(Min<int64_t>(kValueBlock, ctx - p0));
    cursor.Take(n, rows);
    PrefetchValueBlocks<float>(kv, ctx, hd, p0 + n);
    for (int h = 0; h < g; ++h) rows_of[h] = sh + h * stride + p0;
    for (int c0 = 0; c0 < chunks; c0 += kPassChunks) {
      const int c = Min(kPassChunks, chunks - c0);
      const bool tail = 16 * (c0 + c) > hd;
      kValueRows[tail][g][c](rows, n, rows_of, hd, c0, acc);
    }
  }
}

// ---- The V sum over a BF16 cache: BF16 dot products over pairs of positions ----
//
// Two V rows (positions 2i, 2i + 1) interleaved element by element are 16 words of pairs, and
// the two weights (BF16 numerators) one broadcast word: vdpbf16ps adds the odd position's
// product, then the even one's, into each element's sum (generic's order). The interleave
// (vpunpcklwd / vpunpckhwd, within 128-bit lanes) puts 32 elements of head_dim into two
// accumulators in the order lo: 0-3, 8-11, 16-19, 24-27 and hi: 4-7, 12-15, 20-23, 28-31; they
// wait between blocks in that order and are put back in place once, at the output.

// acc[h][32 * c, + 32) += the weighted sum of the row pairs (rows[2i], rows[2i + 1]) for
// i < pairs, weights w[h * w_stride + i] (a pair of BF16 numerators; G heads; kTail: the
// 32-element chunk c is partial). Steps `ahead` once a pair (a copy in registers while it
// loops).
template <int G, bool kTail>
void AddValuePairs(const uint16_t* const* rows, int pairs, const uint32_t* w, int64_t w_stride,
                   int hd, int c, HeadAccumulators acc, AheadLines& ahead_lines) {
  AheadLines ahead = ahead_lines;
  const int live = hd - 32 * c;
  const __mmask32 mask = live >= 32 ? ~__mmask32{0} : (__mmask32{1} << live) - 1;
  __m512 lo[G], hi[G];
  for (int h = 0; h < G; ++h) {
    lo[h] = _mm512_load_ps(acc[h] + 32 * c);
    hi[h] = _mm512_load_ps(acc[h] + 32 * c + 16);
  }
  for (int i = 0; i < pairs; ++i) {
    const uint16_t* even = rows[2 * i] + 32 * c;
    const uint16_t* odd = rows[2 * i + 1] + 32 * c;
    const __m512i a = kTail ? _mm512_maskz_loadu_epi16(mask, even) : _mm512_loadu_si512(even);
    const __m512i b = kTail ? _mm512_maskz_loadu_epi16(mask, odd) : _mm512_loadu_si512(odd);
    const __m512bh vlo = (__m512bh)_mm512_unpacklo_epi16(a, b);
    const __m512bh vhi = (__m512bh)_mm512_unpackhi_epi16(a, b);
    ahead.Step();
    for (int h = 0; h < G; ++h) {
      uint32_t pair;  // bytes of the scores' memory (floats): read as bytes, not as a uint32_t
      std::memcpy(&pair, w + h * w_stride + i, sizeof(pair));
      const __m512bh weights = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
      lo[h] = _mm512_dpbf16_ps(lo[h], vlo, weights);
      hi[h] = _mm512_dpbf16_ps(hi[h], vhi, weights);
    }
  }
  for (int h = 0; h < G; ++h) {
    _mm512_store_ps(acc[h] + 32 * c, lo[h]);
    _mm512_store_ps(acc[h] + 32 * c + 16, hi[h]);
  }
  ahead_lines = ahead;
}

using ValuePairsFn = void (*)(const uint16_t* const*, int, const uint32_t*, int64_t, int, int,
                              HeadAccumulators, AheadLines&);
template <bool kTail, size_t... G>
constexpr Array<ValuePairsFn, kMaxGroup + 1> ValuePairsOf(std::index_sequence<G...>) {
  return {nullptr, &AddValuePairs<static_cast<int>(G) + 1, kTail>...};
}

// The weighted V sum of g <= kMaxGroup heads over positions [0, ctx) into acc (in the
// interleaved order), blocks of kValueBlock positions; head h's BF16 numerators start at sh +
// h * stride (ExpToBF16InPlace; an odd last position is paired with a zero row and a zero
// weight). Every 32-element chunk passes over a block while it sits in L1, prefetching the next
// block into L1 and the one after into L2.
void SumValuePairs(const internal::HeadPages& kv, int64_t ctx, int hd, const float* sh,
                   int64_t stride, int g, HeadAccumulators acc) {
  static constexpr Array<Array<ValuePairsFn, kMaxGroup + 1>, 2> kValuePairs = {
      ValuePairsOf<false>(std::make_index_sequence<kMaxGroup>()),
      ValuePairsOf<true>(std::make_index_sequence<kMaxGroup>())};
  const int chunks = (hd + 31) / 32;
  const uint16_t* rows[kValueBlock];
  // Each 32-bit word of a head's numerators is a pair of positions' weights.
  const uint32_t* w = reinterpret_cast<const uint32_t*>(sh);
  PageCursor<uint16_t> cursor(kv.v, kv.page_tokens, hd, 0);
  for (int64_t p0 = 0; p0 < ctx; p0 += kValueBlock) {
    const int n = static_cast<int>(Min<int64_t>(kValueBlock, ctx - p0));
    cursor.Take(n, rows);
    if (n % 2 != 0) rows[n] = reinterpret_cast<const uint16_t*>(kZeroRow);
    const int64_t next = p0 + n;
    AheadLines ahead(kv.v, kv.page_tokens, hd, ctx, next, Min(ctx, next + kValueBlock),
                     kValueBlock);
    const int pairs = (n + 1) / 2;
    for (int c = 0; c < chunks; ++c) {
      kValuePairs[32 * (c + 1) > hd][g](rows, pairs, w + p0 / 2, stride, hd, c, acc, ahead);
    }
  }
}

// out[h] = acc[h] * inv_sum[h] for g heads, the elements of SumValuePairs' accumulators put
// back in order.
void StorePairOutputs(HeadAccumulators acc, const float* inv_sum, int g, int hd, float* out) {
  alignas(64) static constexpr int32_t kFirst[16] = {0, 1, 2, 3, 16, 17, 18, 19,
                                                     4, 5, 6, 7, 20, 21, 22, 23};
  alignas(64) static constexpr int32_t kSecond[16] = {8,  9,  10, 11, 24, 25, 26, 27,
                                                      12, 13, 14, 15, 28, 29, 30, 31};
  const __m512i first = _mm512_load_si512(kFirst);
  const __m512i second = _mm512_load_si512(kSecond);
  for (int h = 0; h < g; ++h) {
    const __m512 vinv = _mm512_set1_ps(inv_sum[h]);
    for (int c = 0; 32 * c < hd; ++c) {
      const __m512 lo = _mm512_load_ps(acc[h] + 32 * c);
      const __m512 hi = _mm512_load_ps(acc[h] + 32 * c + 16);
      float* at = out + h * hd + 32 * c;
      _mm512_mask_storeu_ps(at, TailMask16(hd - 32 * c),
                            _mm512_mul_ps(_mm512_permutex2var_ps(lo, first, hi), vinv));
      _mm512_mask_storeu_ps(at + 16, TailMask16(hd - 32 * c - 16),
                            _mm512_mul_ps(_mm512_permutex2var_ps(lo, second, hi), vinv));
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
  // Scores: each pass's key tiles (two over a BF16 cache, PassScores; one over F32) serve every
  // query of the run and every head.
  constexpr bool kBF16 = sizeof(Elem) == sizeof(uint16_t);
  constexpr int kPassTiles = kBF16 ? 2 : 1;
  constexpr int kPass = kPassTiles * kKeyTile;
  PageCursor<Elem> cursor(kv.k, kv.page_tokens, hd, 0);
  [[maybe_unused]] alignas(64) TileWords key_words;  // a BF16 pass's tiles, transposed
  for (int64_t p0 = 0; p0 < ctx; p0 += kPass) {
    const int64_t near = Min(ctx, p0 + kKeyTilesAhead * kKeyTile);
    const int64_t far = Min(ctx, p0 + kTilesAheadL2 * kKeyTile);
    if constexpr (!kBF16) {
      PrefetchRows<Elem>(kv.k, kv.page_tokens, hd, near, Min(ctx, near + kPass));
      PrefetchRows<Elem, _MM_HINT_T1>(kv.k, kv.page_tokens, hd, far, Min(ctx, far + kPass));
    }
    const int tiles = p0 + kKeyTile < ctx ? kPassTiles : 1;
    for (int t = 0; t < tiles; ++t) {
      const Elem* rows[kKeyTile];
      const int live = static_cast<int>(Min<int64_t>(kKeyTile, ctx - p0 - kKeyTile * t));
      cursor.Take(live, rows);
      for (int r = live; r < kKeyTile; ++r) rows[r] = reinterpret_cast<const Elem*>(kZeroRow);
      if constexpr (kBF16) {
        TransposeTileWords(rows, hd, key_words[t]);
      } else {
        TileScoresF32(rows, queries, count, hd, scale, heads, p0, scores, stride);
      }
    }
    if constexpr (kBF16) {
      AheadLines ahead(kv.k, kv.page_tokens, hd, ctx, near, far, kPass);
      if (tiles == 2) {
        PassScores<2>(key_words, queries, count, hd, scale, heads, p0, scores, stride, ahead);
      } else {
        PassScores<1>(key_words, queries, count, hd, scale, heads, p0, scores, stride, ahead);
      }
    }
  }
  // Softmax and the weighted V sum, per query and group of heads.
  PrefetchRows<Elem, _MM_HINT_T1>(kv.v, kv.page_tokens, hd, 0,
                                  Min<int64_t>(ctx, kValueBlocksAhead * kValueBlock));
  alignas(64) float acc[kMaxGroup][16 * kMaxHeadChunks];
  for (int r = 0; r < count; ++r) {
    const int64_t qctx = queries[r].ctx;
    for (int h = 0; h < heads; h += kMaxGroup) {
      const int g = Min(kMaxGroup, heads - h);
      float* sh = scores + (static_cast<int64_t>(r) * heads + h) * stride;
      float inv_sum[kMaxGroup];
      for (int i = 0; i < g; ++i) {
        inv_sum[i] = SoftmaxNumerators<Elem>(sh + i * stride, qctx);
        std::memset(acc[i], 0, sizeof(acc[i]));
      }
      float* out = queries[r].out + static_cast<size_t>(h) * hd;
      if constexpr (sizeof(Elem) == sizeof(uint16_t)) {
        SumValuePairs(kv, qctx, hd, sh, stride, g, acc);
        StorePairOutputs(acc, inv_sum, g, hd, out);
      } else {
        SumValues(kv, qctx, hd, sh, stride, g, acc);
        for (int i = 0; i < g; ++i) {
          const __m512 vinv = _mm512_set1_ps(inv_sum[i]);
          for (int c = 0; c < hd; c += 16) {
            _mm512_mask_storeu_ps(out + i * hd + c, TailMask16(hd - c),
                                  _mm512_mul_ps(_mm512_load_ps(acc[i] + c), vinv));
          }
        }
      }
    }
  }
}

}  // namespace

namespace internal {
void Avx512AttendPages(const PageQuery* queries, int count, const HeadPages& kv, int hd,
                       float scale, int heads, float* scores) {
  if (kv.bf16) {
    AttendPagesOf<uint16_t>(queries, count, kv, hd, scale, heads, scores);
  } else {
    AttendPagesOf<float>(queries, count, kv, hd, scale, heads, scores);
  }
}
}  // namespace internal

}  // namespace pdserve::kernels
