#include "model/kernels.h"

// GCC 12's AVX-512 headers build some intrinsics from _mm*_undefined_*() values, which
// -Wuninitialized reports inside the header; the values are overwritten, so silence it here.
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>
#include <vector>

#include "common/check.h"
#include "model/dtype.h"

namespace pdserve::kernels {
namespace {

// Tile shape of the matrix products: kRows weight rows x kTokens activation rows, one
// accumulator each (24 of the 32 zmm registers). kTokenBlock rows of x are processed per pass
// so they stay in L2 while every weight row streams past them.
constexpr int kRows = 4;
constexpr int kTokens = 6;
constexpr int kTokenBlock = 16 * kTokens;
// Below this many multiply-adds a kernel runs on the calling thread only.
constexpr int64_t kParallelMacs = int64_t{1} << 18;

inline __mmask16 TailMask16(int remaining) {
  return remaining >= 16 ? static_cast<__mmask16>(0xffff)
                         : static_cast<__mmask16>((1u << remaining) - 1);
}
inline __mmask32 TailMask32(int remaining) {
  return remaining >= 32 ? static_cast<__mmask32>(0xffffffffu)
                         : static_cast<__mmask32>((1u << remaining) - 1);
}

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
    const int live = std::min(16, kCount - g);
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

// One tile of y = x * w^T with BF16 inputs. Each accumulator holds 16 lanes of partial sums
// along k, in the same order for every tile shape, so results are batch-invariant.
template <int R, int T>
struct TileBF16 {
  static void Run(const uint16_t* x, const uint16_t* w, float* y, int n, int k, int r0, int t0);
};
template <int R, int T>
void TileBF16<R, T>::Run(const uint16_t* x, const uint16_t* w, float* y, int n, int k, int r0,
                         int t0) {
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  const uint16_t* wr[R];
  const uint16_t* xt[T];
  for (int r = 0; r < R; ++r) wr[r] = w + static_cast<size_t>(r0 + r) * k;
  for (int t = 0; t < T; ++t) xt[t] = x + static_cast<size_t>(t0 + t) * k;
  int kk = 0;
  const size_t ahead = static_cast<size_t>(R) * k;
  for (; kk + 32 <= k; kk += 32) {
    __m512bh wv[R];
    for (int r = 0; r < R; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(wr[r] + kk + ahead), _MM_HINT_T0);
      wv[r] = (__m512bh)_mm512_loadu_si512(wr[r] + kk);
    }
    for (int t = 0; t < T; ++t) {
      __m512bh xv = (__m512bh)_mm512_loadu_si512(xt[t] + kk);
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], xv, wv[r]);
    }
  }
  if (kk < k) {
    __mmask32 mask = TailMask32(k - kk);
    __m512bh wv[R];
    for (int r = 0; r < R; ++r) wv[r] = (__m512bh)_mm512_maskz_loadu_epi16(mask, wr[r] + kk);
    for (int t = 0; t < T; ++t) {
      __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mask, xt[t] + kk);
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], xv, wv[r]);
    }
  }
  StoreTile<R, T>(acc, y, n, r0, t0);
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

template <typename Elem>
using TileFn = void (*)(const Elem*, const Elem*, float*, int, int, int, int);

// Tiles of every token count 1..kTokens, so that the weight rows of a block are read once per
// token block whatever the batch size (a 2-token decode step must not read weights twice).
template <typename Elem, template <int, int> class Tile, int R, size_t... T>
constexpr std::array<TileFn<Elem>, kTokens + 1> TileTable(std::index_sequence<T...>) {
  return {nullptr, &Tile<R, static_cast<int>(T) + 1>::Run...};
}

// Drives the tiles over the whole product: row blocks in parallel, token blocks in sequence.
template <typename Elem, template <int, int> class Tile>
void MatMulDriver(const Elem* x, const Elem* w, float* y, int m, int n, int k) {
  static constexpr auto kBlockTiles =
      TileTable<Elem, Tile, kRows>(std::make_index_sequence<kTokens>());
  static constexpr auto kRowTiles = TileTable<Elem, Tile, 1>(std::make_index_sequence<kTokens>());
  const int row_blocks = (n + kRows - 1) / kRows;
  // Small products run on one thread: waking the team costs more than it saves.
  const bool parallel = static_cast<int64_t>(std::min(m, kTokenBlock)) * n * k >= kParallelMacs;
  for (int tb = 0; tb < m; tb += kTokenBlock) {
    const int t_end = std::min(m, tb + kTokenBlock);
#pragma omp parallel for schedule(static) if (parallel)
    for (int b = 0; b < row_blocks; ++b) {
      const int r0 = b * kRows;
      for (int t = tb; t < t_end; t += kTokens) {
        const int tokens = std::min(kTokens, t_end - t);
        if (r0 + kRows <= n) {
          kBlockTiles[tokens](x, w, y, n, k, r0, t);
        } else {
          for (int r = r0; r < n; ++r) kRowTiles[tokens](x, w, y, n, k, r, t);
        }
      }
    }
  }
}

// e^x for 16 lanes: range reduction to r in [-ln2/2, ln2/2], degree-7 Taylor polynomial
// (relative error < 1e-8 before float rounding), scaled by 2^n. Lane-wise, so deterministic.
inline __m512 Exp512(__m512 x) {
  const __m512 kLog2e = _mm512_set1_ps(1.44269504088896341f);
  const __m512 kLn2Hi = _mm512_set1_ps(0.693359375f);
  const __m512 kLn2Lo = _mm512_set1_ps(-2.12194440e-4f);
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f)), _mm512_set1_ps(-103.0f));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, kLog2e), _MM_FROUND_TO_NEAREST_INT);
  __m512 r = _mm512_fnmadd_ps(n, kLn2Hi, x);
  r = _mm512_fnmadd_ps(n, kLn2Lo, r);
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// Loads 16 (masked) KV elements as floats.
inline __m512 LoadKv(const float* p, __mmask16 mask) { return _mm512_maskz_loadu_ps(mask, p); }
inline __m512 LoadKv(const uint16_t* p, __mmask16 mask) {
  __m256i raw = _mm256_maskz_loadu_epi16(mask, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

constexpr int kMaxHeadChunks = 16;  // head_dim <= 256

template <typename KvElem>
void AttendOne(const AttentionQuery& query, int head, const KvCache& cache, int layer, int group,
               float scale, std::vector<float>& scores) {
  const KvLayout& layout = cache.layout();
  const int hd = layout.head_dim;
  const int page_tokens = layout.page_tokens;
  const int kv_head = head / group;
  const float* q = query.q + static_cast<size_t>(head) * hd;
  const int64_t ctx = query.context_len;
  const int chunks = (hd + 15) / 16;
  __m512 qv[kMaxHeadChunks];
  for (int c = 0; c < chunks; ++c)
    qv[c] = _mm512_maskz_loadu_ps(TailMask16(hd - 16 * c), q + 16 * c);

  scores.resize(static_cast<size_t>(ctx));
  // Walks the K or V rows of positions 0, 1, 2, ... of this KV head through the block table
  // (no division per position).
  struct RowCursor {
    const KvCache& cache;
    const PageId* pages;
    int layer, page_tokens, hd;
    bool is_v;
    size_t head_offset;
    int64_t page = 0;
    int slot = 0;
    const KvElem* row = nullptr;
    void Start() {
      row = reinterpret_cast<const KvElem*>(cache.Block(layer, pages[page], is_v)) + head_offset;
    }
    void Next() {
      if (++slot < page_tokens) {
        row += hd;
        return;
      }
      slot = 0;
      ++page;
      Start();
    }
  };
  const size_t head_offset = static_cast<size_t>(kv_head) * page_tokens * hd;
  // Scores 16 positions at a time; each dot product is summed in a fixed order (head_dim
  // chunks in sequence, then the lane tree), so it does not depend on its 15 neighbours.
  const __m512 vscale = _mm512_set1_ps(scale);
  __m512 vmax_scores = _mm512_set1_ps(-INFINITY);
  RowCursor keys{cache, query.pages, layer, page_tokens, hd, false, head_offset};
  keys.Start();
  for (int64_t pos0 = 0; pos0 < ctx; pos0 += 16) {
    const int live = static_cast<int>(std::min<int64_t>(16, ctx - pos0));
    __m512 acc[16];
    for (int i = 0; i < 16; ++i) {
      acc[i] = _mm512_setzero_ps();
      if (i >= live) continue;
      for (int c = 0; c < chunks; ++c) {
        acc[i] = _mm512_fmadd_ps(qv[c], LoadKv(keys.row + 16 * c, TailMask16(hd - 16 * c)), acc[i]);
      }
      if (pos0 + i + 1 < ctx) keys.Next();
    }
    const __mmask16 mask = TailMask16(live);
    const __m512 s = _mm512_mul_ps(HorizontalSums16(acc), vscale);
    _mm512_mask_storeu_ps(&scores[pos0], mask, s);
    vmax_scores = _mm512_mask_max_ps(vmax_scores, mask, vmax_scores, s);
  }
  const float max_score = _mm512_reduce_max_ps(vmax_scores);
  // Softmax numerators and their sum, 16 positions at a time.
  const __m512 vmax = _mm512_set1_ps(max_score);
  __m512 vsum = _mm512_setzero_ps();
  for (int64_t pos = 0; pos < ctx; pos += 16) {
    __mmask16 mask = TailMask16(static_cast<int>(std::min<int64_t>(16, ctx - pos)));
    __m512 e = Exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, &scores[pos]), vmax));
    e = _mm512_maskz_mov_ps(mask, e);
    _mm512_mask_storeu_ps(&scores[pos], mask, e);
    vsum = _mm512_add_ps(vsum, e);
  }
  const float inv_sum = 1.0f / _mm512_reduce_add_ps(vsum);
  __m512 out[kMaxHeadChunks];
  for (int c = 0; c < chunks; ++c) out[c] = _mm512_setzero_ps();
  RowCursor values{cache, query.pages, layer, page_tokens, hd, true, head_offset};
  values.Start();
  for (int64_t pos = 0; pos < ctx; ++pos) {
    const __m512 p = _mm512_set1_ps(scores[pos]);
    for (int c = 0; c < chunks; ++c) {
      out[c] = _mm512_fmadd_ps(p, LoadKv(values.row + 16 * c, TailMask16(hd - 16 * c)), out[c]);
    }
    if (pos + 1 < ctx) values.Next();
  }
  float* dst = query.out + static_cast<size_t>(head) * hd;
  const __m512 vinv = _mm512_set1_ps(inv_sum);
  for (int c = 0; c < chunks; ++c) {
    _mm512_mask_storeu_ps(dst + 16 * c, TailMask16(hd - 16 * c), _mm512_mul_ps(out[c], vinv));
  }
}

template <typename KvElem>
void PagedAttentionImpl(std::span<const AttentionQuery> queries, const KvCache& cache, int layer,
                        int num_heads, float scale) {
  const int group = num_heads / cache.layout().num_kv_heads;
  const int64_t work = static_cast<int64_t>(queries.size()) * num_heads;
  int64_t macs = 0;
  for (const AttentionQuery& q : queries) macs += q.context_len;
  macs *= static_cast<int64_t>(num_heads) * 2 * cache.layout().head_dim;
#pragma omp parallel if (macs >= kParallelMacs)
  {
    std::vector<float> scores;
#pragma omp for schedule(dynamic, 4)
    for (int64_t i = 0; i < work; ++i) {
      AttendOne<KvElem>(queries[i / num_heads], static_cast<int>(i % num_heads), cache, layer,
                        group, scale, scores);
    }
  }
}

}  // namespace

void MatMulBF16(const uint16_t* x, const uint16_t* w, float* y, int m, int n, int k) {
  MatMulDriver<uint16_t, TileBF16>(x, w, y, m, n, k);
}

void MatMulF32(const float* x, const float* w, float* y, int m, int n, int k) {
  MatMulDriver<float, TileF32>(x, w, y, m, n, k);
}

void ToBF16(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = F32ToBF16(src[i]);
}

void RmsNorm(const float* x, const float* weight, float* out, int rows, int dim, float eps) {
#pragma omp parallel for schedule(static) if (static_cast <int64_t>(rows) * dim >= \
                                              kParallelMacs / 8)
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<size_t>(r) * dim;
    float* yr = out + static_cast<size_t>(r) * dim;
    __m512 acc = _mm512_setzero_ps();
    for (int i = 0; i < dim; i += 16) {
      __m512 v = _mm512_maskz_loadu_ps(TailMask16(dim - i), xr + i);
      acc = _mm512_fmadd_ps(v, v, acc);
    }
    const float inv = 1.0f / std::sqrt(_mm512_reduce_add_ps(acc) / dim + eps);
    for (int i = 0; i < dim; ++i) yr[i] = xr[i] * inv * weight[i];
  }
}

void ApplyRope(float* x, int heads, int head_dim, const float* cos, const float* sin) {
  const int half = head_dim / 2;
  for (int h = 0; h < heads; ++h) {
    float* v = x + static_cast<size_t>(h) * head_dim;
    for (int i = 0; i < half; ++i) {
      const float a = v[i];
      const float b = v[i + half];
      v[i] = a * cos[i] - b * sin[i];
      v[i + half] = b * cos[i] + a * sin[i];
    }
  }
}

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

void PagedAttention(std::span<const AttentionQuery> queries, const KvCache& cache, int layer,
                    int num_heads, float scale) {
  PD_CHECK(cache.layout().head_dim <= 16 * kMaxHeadChunks);
  if (cache.layout().dtype == KvDType::kF32) {
    PagedAttentionImpl<float>(queries, cache, layer, num_heads, scale);
  } else {
    PagedAttentionImpl<uint16_t>(queries, cache, layer, num_heads, scale);
  }
}

void StoreKv(KvCache& cache, int layer, PageId page, int slot, const float* k, const float* v) {
  const KvLayout& layout = cache.layout();
  const int hd = layout.head_dim;
  for (int is_v = 0; is_v < 2; ++is_v) {
    const float* src = is_v ? v : k;
    uint8_t* block = cache.Block(layer, page, is_v != 0);
    for (int h = 0; h < layout.num_kv_heads; ++h) {
      const size_t elem = (static_cast<size_t>(h) * layout.page_tokens + slot) * hd;
      const float* s = src + static_cast<size_t>(h) * hd;
      if (layout.dtype == KvDType::kF32) {
        std::copy(s, s + hd, reinterpret_cast<float*>(block) + elem);
      } else {
        ToBF16(s, reinterpret_cast<uint16_t*>(block) + elem, hd);
      }
    }
  }
}

}  // namespace pdserve::kernels
