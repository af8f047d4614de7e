// The public kernels: the ISA-independent parts (walkers, packing, OpenMP, scratch) once, the
// inner loops from the active path's KernelTable. Compiled for baseline x86-64 (or any CPU).
#include "kernels/kernels.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "common/check.h"
#include "common/dtype.h"
#include "kernels/kernel_table.h"

namespace pdserve::kernels {
namespace {

using internal::Active;
using internal::kBlockCols;
using internal::kBlockGroups;
using internal::kFp8ScaleBytes;
using internal::kGroupCols;
using internal::kPairElems;
using internal::kPairLineBytes;
using internal::kParallelMacs;
using internal::kRows;
using internal::kTokenBlock;
using internal::kTokens;
static_assert(internal::kFp8BlockK == kFp8BlockK);

// body(i) for i in [0, n): split statically over the OpenMP team when `parallel`, otherwise on
// the calling thread without opening a region at all. Even a one-thread region (an `if` clause
// that is false, or a region nested in a parallel loop) costs about a microsecond to open and
// close; StoreKv, called per token inside the transformer's parallel loops, once spent more time
// there than converting its values.
template <typename Body>
void ParallelFor(int64_t n, bool parallel, Body&& body) {
  if (!parallel) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) body(i);
}

// Walks a product's tiles: weight blocks in parallel, token blocks of kTokenBlock rows in
// sequence (so they stay in L2 while every weight block streams past), tile_tokens rows per
// tile. tile(block, first_row, rows, token_block) computes one tile of the token block
// [token_block.first, token_block.end). Small products run on the calling thread: waking the
// team costs more than it saves.
struct TokenBlock {
  int first, end;
};
template <typename TileAt>
void ForEachTile(int m, int n, int k, int weight_blocks, int tile_tokens, TileAt&& tile) {
  const bool parallel = static_cast<int64_t>(std::min(m, kTokenBlock)) * n * k >= kParallelMacs;
  for (int tb = 0; tb < m; tb += kTokenBlock) {
    const int t_end = std::min(m, tb + kTokenBlock);
    ParallelFor(weight_blocks, parallel, [&](int64_t b) {
      for (int t = tb; t < t_end; t += tile_tokens) {
        tile(static_cast<int>(b), t, std::min(tile_tokens, t_end - t), TokenBlock{tb, t_end});
      }
    });
  }
}

// ForEachTile over several products of one shape: every (product, token block, weight block) is
// an item of one parallel loop, in that order, each walking its token block's tiles as
// ForEachTile does. tile(product, block, first_row, rows, token_block).
template <typename TileAt>
void ForEachGroupedTile(std::span<const GroupedProduct> products, int n, int k, int weight_blocks,
                        int tile_tokens, TileAt&& tile) {
  struct Item {
    int product, block;
    TokenBlock rows;
  };
  std::vector<Item> items;
  int64_t macs = 0;
  for (int p = 0; p < static_cast<int>(products.size()); ++p) {
    const int m = products[p].m;
    macs += static_cast<int64_t>(m) * n * k;
    for (int tb = 0; tb < m; tb += kTokenBlock) {
      for (int b = 0; b < weight_blocks; ++b) {
        items.push_back({p, b, TokenBlock{tb, std::min(m, tb + kTokenBlock)}});
      }
    }
  }
  ParallelFor(static_cast<int64_t>(items.size()), macs >= kParallelMacs, [&](int64_t i) {
    const Item& it = items[i];
    for (int t = it.rows.first; t < it.rows.end; t += tile_tokens) {
      tile(it.product, it.block, t, std::min(tile_tokens, it.rows.end - t), it.rows);
    }
  });
}

// Runs of up to `max_run` consecutive queries of one sequence (a prefill chunk): [first, last)
// query indices. A run shares its K/V rows (each key tile widened once).
std::vector<std::pair<size_t, size_t>> QueryRuns(std::span<const AttentionQuery> queries,
                                                 size_t max_run) {
  std::vector<std::pair<size_t, size_t>> runs;
  for (size_t i = 0; i < queries.size();) {
    size_t j = i + 1;
    while (j < queries.size() && j - i < max_run && queries[j].pages == queries[i].pages) ++j;
    runs.emplace_back(i, j);
    i = j;
  }
  return runs;
}

int64_t LongestContext(std::span<const AttentionQuery> queries, size_t first, size_t last) {
  int64_t ctx = 0;
  for (size_t q = first; q < last; ++q) ctx = std::max(ctx, queries[q].context_len);
  return ctx;
}

// Whether attention is worth an OpenMP team: its multiply-adds against kParallelMacs.
bool AttentionIsParallel(std::span<const AttentionQuery> queries, int num_heads, int hd) {
  int64_t macs = 0;
  for (const AttentionQuery& q : queries) macs += q.context_len;
  return macs * num_heads * 2 * hd >= kParallelMacs;
}

// The path's attend_pages per (run, KV head): K and V read where they lie, in whatever dtype
// the cache holds. A run keeps the scores of all its queries at once (count * group * context
// floats), so runs are at most kPageRun queries.
void PageAttention(std::span<const AttentionQuery> queries, const KvCache& cache, int layer,
                   int num_heads, float scale) {
  const internal::KernelTable& path = Active();
  const KvLayout& layout = cache.layout();
  const int kv_heads = layout.num_kv_heads;
  const int group = num_heads / kv_heads;
  const int hd = layout.head_dim;
  const size_t head_offset = layout.head_bytes();
  constexpr size_t kPageRun = 8;
  const auto runs = QueryRuns(queries, kPageRun);
  const int64_t work = static_cast<int64_t>(runs.size()) * kv_heads;
#pragma omp parallel if (AttentionIsParallel(queries, num_heads, hd))
  {
    // Per thread, kept across calls: the pages' K and V rows of one KV head, the scores, and
    // (a BF16 cache) the run's queries rounded to BF16 as attend_pages takes them.
    thread_local std::vector<const void*> k_pages, v_pages;
    thread_local std::vector<float> scores;
    thread_local std::vector<float> q_rounded;
    thread_local std::vector<uint16_t> q_pairs;
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < work; ++i) {
      const auto [first, last] = runs[i / kv_heads];
      const int kv_head = static_cast<int>(i % kv_heads);
      const int64_t ctx = LongestContext(queries, first, last);
      const int64_t pages = layout.PagesForTokens(ctx);
      k_pages.resize(pages);
      v_pages.resize(pages);
      for (int64_t p = 0; p < pages; ++p) {
        const PageId page = queries[first].pages[p];
        k_pages[p] = cache.Block(layer, page, KvComponent::kK) + kv_head * head_offset;
        v_pages[p] = cache.Block(layer, page, KvComponent::kV) + kv_head * head_offset;
      }
      const size_t score_floats =
          (last - first) * group * static_cast<size_t>((ctx + 15) / 16 * 16);
      if (scores.size() < score_floats) scores.resize(score_floats);
      internal::PageQuery run[kPageRun];
      const size_t h = static_cast<size_t>(kv_head) * group * hd;
      const internal::HeadPages kv{.k = k_pages.data(),
                                   .v = v_pages.data(),
                                   .page_tokens = layout.page_tokens,
                                   .bf16 = layout.dtype == DType::kBF16};
      const size_t rounded_floats = static_cast<size_t>(group) * hd;
      const size_t pair_values = static_cast<size_t>(group) * 2 * internal::QueryPairs(hd);
      if (kv.bf16) {
        q_rounded.resize((last - first) * rounded_floats);
        q_pairs.resize((last - first) * pair_values);
      }
      for (size_t q = first; q < last; ++q) {
        internal::PageQuery& one = run[q - first];
        one = {.q = queries[q].q + h,
               .q_bf16 = nullptr,
               .out = queries[q].out + h,
               .ctx = queries[q].context_len};
        if (kv.bf16) {
          float* rounded = &q_rounded[(q - first) * rounded_floats];
          uint16_t* pairs = &q_pairs[(q - first) * pair_values];
          internal::RoundQueryHeads(one.q, group, hd, rounded, pairs);
          one.q = rounded;
          one.q_bf16 = pairs;
        }
      }
      path.attend_pages(run, static_cast<int>(last - first), kv, hd, scale, group, scores.data());
    }
  }
}

}  // namespace

namespace internal {

int Pairs(int k) { return (k + 1) / 2; }
int ColBlocks(int n) { return (n + kBlockCols - 1) / kBlockCols; }
int64_t Fp8BlockBytes(int k) {
  const int64_t k_blocks = (k + kFp8BlockK - 1) / kFp8BlockK;
  return k_blocks * kFp8ScaleBytes + static_cast<int64_t>(Pairs(k)) * kPairLineBytes;
}
int Int8KBlocks(int k) { return (k + kFp8BlockK - 1) / kFp8BlockK; }
int Int8RowBytes(int k) { return (k + 3) / 4 * 4; }
int64_t Int8BlockBytes(int k) {
  return static_cast<int64_t>(Int8KBlocks(k)) * internal::kInt8BlockHeadBytes +
         static_cast<int64_t>(Int8RowBytes(k) / 4) * internal::kInt8QuadLineBytes;
}
int QueryPairs(int hd) { return (hd + 1) / 2; }

void RoundQueryHeads(const float* q, int heads, int hd, float* rounded, uint16_t* pairs) {
  const int row = 2 * QueryPairs(hd);
  for (int h = 0; h < heads; ++h) {
    for (int d = 0; d < row; ++d) {
      uint16_t b = 0;
      if (d < hd) {
        b = F32ToBF16(q[h * hd + d]);
        if ((b & 0x7f80) == 0) b &= 0x8000;  // zero or denormal: a zero of its sign
        rounded[h * hd + d] = BF16ToF32(b);
      }
      pairs[h * row + d] = b;
    }
  }
}

float SumLaneTree16(const float* v) {
  float s8[8], s4[4];
  for (int i = 0; i < 8; ++i) s8[i] = v[i] + v[i + 8];
  for (int i = 0; i < 4; ++i) s4[i] = s8[i] + s8[i + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

}  // namespace internal

size_t PackedBF16Elements(int n, int k) {
  return static_cast<size_t>(internal::ColBlocks(n)) * internal::Pairs(k) * kPairElems;
}

void PackBF16(const uint16_t* w, int n, int k, uint16_t* packed) {
  const size_t block_elems = static_cast<size_t>(internal::Pairs(k)) * kPairElems;
  const int blocks = internal::ColBlocks(n);
  // Blocks are independent (and a whole model is packed at load): one per iteration.
  ParallelFor(blocks, static_cast<int64_t>(n) * k >= kParallelMacs, [&](int64_t block_index) {
    const int b = static_cast<int>(block_index);
    uint16_t* block = packed + b * block_elems;
    std::fill(block, block + block_elems, uint16_t{0});
    for (int c = b * kBlockCols; c < std::min(n, (b + 1) * kBlockCols); ++c) {
      uint16_t* dst = block + 2 * (c % kBlockCols);
      const uint16_t* src = w + static_cast<size_t>(c) * k;
      for (int i = 0; i < k; ++i) dst[static_cast<size_t>(i / 2) * kPairElems + i % 2] = src[i];
    }
  });
}

void UnpackRowBF16(const uint16_t* packed, int n, int k, int row, float* out) {
  PD_CHECK(row >= 0 && row < n);
  const uint16_t* src = packed +
                        static_cast<size_t>(row / kBlockCols) * internal::Pairs(k) * kPairElems +
                        2 * (row % kBlockCols);
  for (int i = 0; i < k; ++i)
    out[i] = BF16ToF32(src[static_cast<size_t>(i / 2) * kPairElems + i % 2]);
}

namespace {

// Within a token block, a weight block's first tile reads it from memory and every later tile
// from L2, so the first tile waits on the memory while the later ones leave it idle. In a
// token block of at least three tiles, the later tiles bring the next weight block (the
// thread's next one under ParallelFor's static schedule) toward L2, in shares by rows, so that
// its stream runs under their compute. With fewer rows the product is bound by the stream
// itself and the hint only costs (measured: docs/kernels.md, "Products: the next weight block
// toward L2"). The share of the tile of `tokens` rows from row t, whose first `first_rows` rows
// are the first tile's; `next` is the next weight block (null: none).
internal::BlockAhead NextBlockShare(const uint8_t* next, int64_t block_bytes, TokenBlock tb,
                                    int first_rows, int t, int tokens) {
  const int rows = tb.end - tb.first;
  const int later = t - tb.first - first_rows;  // rows of the later tiles before this one
  if (next == nullptr || rows < 3 * first_rows || later < 0) return {};
  const int64_t from = block_bytes * later / (rows - first_rows) / 64 * 64;
  const int64_t to = block_bytes * (later + tokens) / (rows - first_rows);
  return {.at = next + from, .bytes = to - from};
}

int BlockGroups(int n, int c0) {
  return std::min(kBlockGroups, (n - c0 + kGroupCols - 1) / kGroupCols);
}

}  // namespace

namespace {

// One tile of a BF16 product (MatMulBF16's and MatMulBF16Grouped's): block b, rows [t, t + tokens).
void PackedTile(const internal::KernelTable& path, const uint16_t* x, const uint16_t* packed_w,
                float* y, int n, int k, int b, int t, int tokens, TokenBlock tb) {
  const size_t block_elems = static_cast<size_t>(internal::Pairs(k)) * kPairElems;
  const int blocks = internal::ColBlocks(n);
  const int c0 = b * kBlockCols;
  const auto* next =
      b + 1 < blocks ? reinterpret_cast<const uint8_t*>(packed_w + (b + 1) * block_elems) : nullptr;
  path.packed_tile(x, packed_w + b * block_elems, y, n, k, c0, t, BlockGroups(n, c0), tokens,
                   NextBlockShare(next, static_cast<int64_t>(block_elems * sizeof(uint16_t)), tb,
                                  path.packed_tile_tokens, t, tokens));
}

}  // namespace

void MatMulBF16(const uint16_t* x, const uint16_t* packed_w, float* y, int m, int n, int k) {
  const internal::KernelTable& path = Active();
  ForEachTile(m, n, k, internal::ColBlocks(n), path.packed_tile_tokens,
              [&](int b, int t, int tokens, TokenBlock tb) {
                PackedTile(path, x, packed_w, y, n, k, b, t, tokens, tb);
              });
}

void MatMulBF16Grouped(std::span<const GroupedProduct> products, int n, int k) {
  const internal::KernelTable& path = Active();
  ForEachGroupedTile(products, n, k, internal::ColBlocks(n), path.packed_tile_tokens,
                     [&](int p, int b, int t, int tokens, TokenBlock tb) {
                       const GroupedProduct& g = products[p];
                       PackedTile(path, static_cast<const uint16_t*>(g.x),
                                  static_cast<const uint16_t*>(g.w), g.y, n, k, b, t, tokens, tb);
                     });
}

size_t PackedFP8Bytes(int n, int k) {
  return static_cast<size_t>(internal::ColBlocks(n)) * internal::Fp8BlockBytes(k);
}

namespace {

// PackFP8 and PackInt8: each scale times `scale_factor`, the bytes in pair lines at
// position(column, odd); `flush_subnormals` (FP8) stores a subnormal as a zero of its sign
// (kernel_table.h).
void PackBlocked8(const uint8_t* w, const float* row_scales, float scale_factor,
                  int (*position)(int, int), bool flush_subnormals, int n, int k, uint8_t* packed) {
  const int64_t block_bytes = internal::Fp8BlockBytes(k);
  const int k_blocks = (k + kFp8BlockK - 1) / kFp8BlockK;
  ParallelFor(internal::ColBlocks(n), static_cast<int64_t>(n) * k >= kParallelMacs, [&](int64_t b) {
    uint8_t* at = packed + b * block_bytes;
    const int c0 = static_cast<int>(b) * kBlockCols;
    const int cols = std::min(kBlockCols, n - c0);
    for (int j = 0; j < k_blocks; ++j) {
      float scales[kBlockCols] = {};
      for (int c = 0; c < cols; ++c) {
        scales[c] = row_scales[static_cast<size_t>(c0 + c) * k_blocks + j] * scale_factor;
      }
      std::memcpy(at, scales, sizeof(scales));
      at += kFp8ScaleBytes;
      const int k0 = j * kFp8BlockK, kb = std::min(kFp8BlockK, k - k0);
      const size_t line_bytes = static_cast<size_t>(internal::Pairs(kb)) * kPairLineBytes;
      std::memset(at, 0, line_bytes);
      for (int c = 0; c < cols; ++c) {
        const uint8_t* src = w + static_cast<size_t>(c0 + c) * k + k0;
        for (int i = 0; i < kb; ++i) {
          uint8_t byte = src[i];
          if (flush_subnormals && (byte & 0x78) == 0) byte &= 0x80;
          at[(i / 2) * kPairLineBytes + position(c, i % 2)] = byte;
        }
      }
      at += line_bytes;
    }
  });
}

int Fp8Position(int c, int odd) { return internal::Fp8PairPosition(c, odd); }

using Blocked8Tile = void (*)(const uint16_t*, const uint8_t*, float*, int, int, int, int, int, int,
                              internal::BlockAhead, uint16_t*);

// x [m][k] as the 8-bit tiles take it (kernel_table.h): rows of 2 * Pairs(k) BF16 values, each
// x times `factor` (FP8: 2^60; INT8: 1) rounded as vcvtneps2bf16 rounds (the path's
// to_bf16_daz: a denormal as a zero, so that every path sees what vdpbf16ps reads), an odd k's
// last value followed by a zero. Elementwise, so a row's values never depend on the other rows.
void Blocked8Rows(const float* x, int m, int k, float factor, uint16_t* out) {
  const internal::KernelTable& path = Active();
  const size_t stride = 2 * static_cast<size_t>(internal::Pairs(k));
  ParallelFor(m, static_cast<int64_t>(m) * k >= kParallelMacs / 4, [&](int64_t r) {
    uint16_t* dst = out + static_cast<size_t>(r) * stride;
    path.to_bf16_daz(x + static_cast<size_t>(r) * k, factor, dst, k);
    if (stride > static_cast<size_t>(k)) dst[k] = 0;
  });
}

// The FP8 tiles' strip (kernel_table.h, kFp8StripElems BF16 values, 64-byte aligned), one per
// thread, allocated on its first product of more than kTokenBlock rows and kept.
uint16_t* Fp8StripOfThread() {
  thread_local std::vector<uint16_t> strip;
  constexpr size_t kAlignElems = 64 / sizeof(uint16_t);
  if (strip.empty()) strip.resize(internal::kFp8StripElems + kAlignElems);
  const auto address = reinterpret_cast<uintptr_t>(strip.data());
  return strip.data() + (-address & 63) / sizeof(uint16_t);
}

// One call of an FP8 tile (`tile`: the path's fp8_tile): block b, the rows [t, t + tokens) of xb
// (Blocked8Rows). A call of many rows is told the next block, to bring it toward L2 under its
// compute (NextBlockShare's rule: at least three tiles' worth of rows), and more than a token
// block's rows get the thread's strip.
void Blocked8TileAt(Blocked8Tile tile, const uint16_t* xb, const uint8_t* packed_w, float* y, int n,
                    int k, int b, int t, int tokens) {
  const int64_t block_bytes = internal::Fp8BlockBytes(k);
  const int c0 = b * kBlockCols;
  const uint8_t* next = b + 1 < internal::ColBlocks(n) ? packed_w + (b + 1) * block_bytes : nullptr;
  internal::BlockAhead ahead;
  if (next != nullptr && tokens >= 3 * kTokens) ahead = {.at = next, .bytes = block_bytes};
  tile(xb, packed_w + b * block_bytes, y, n, k, c0, t, BlockGroups(n, c0), tokens, ahead,
       tokens > kTokenBlock ? Fp8StripOfThread() : nullptr);
}

// The BF16 rows of the 8-bit products, kept per calling thread across calls.
std::vector<uint16_t>& Blocked8Scratch() {
  thread_local std::vector<uint16_t> rows;
  return rows;
}

// Weight blocks in parallel, each call of `tile` with all m rows: the path tiles them, and
// widens each weight once per product however many rows there are (with more than kTokenBlock
// rows, into the strip: kernel_table.h). Up to kTokenBlock rows this is ForEachTile's walk.
void MatMulBlocked8(Blocked8Tile tile, float factor, const float* x, const uint8_t* packed_w,
                    float* y, int m, int n, int k) {
  if (m == 0) return;
  std::vector<uint16_t>& xb = Blocked8Scratch();
  xb.resize(static_cast<size_t>(m) * 2 * internal::Pairs(k));
  Blocked8Rows(x, m, k, factor, xb.data());
  const bool parallel = static_cast<int64_t>(std::min(m, kTokenBlock)) * n * k >= kParallelMacs;
  ParallelFor(internal::ColBlocks(n), parallel, [&](int64_t b) {
    Blocked8TileAt(tile, xb.data(), packed_w, y, n, k, static_cast<int>(b), 0, m);
  });
}

void MatMulBlocked8Grouped(Blocked8Tile tile, float factor,
                           std::span<const GroupedProduct> products, int n, int k) {
  const size_t stride = 2 * static_cast<size_t>(internal::Pairs(k));
  std::vector<size_t> first(products.size() + 1, 0);
  for (size_t p = 0; p < products.size(); ++p) {
    first[p + 1] = first[p] + static_cast<size_t>(products[p].m) * stride;
  }
  std::vector<uint16_t>& xb = Blocked8Scratch();
  xb.resize(first.back());
  for (size_t p = 0; p < products.size(); ++p) {
    Blocked8Rows(static_cast<const float*>(products[p].x), products[p].m, k, factor,
                 xb.data() + first[p]);
  }
  // Every (product, weight block) is an item of one parallel loop, with all the product's rows
  // (as MatMulBlocked8).
  const int blocks = internal::ColBlocks(n);
  int64_t macs = 0;
  for (const GroupedProduct& g : products) macs += static_cast<int64_t>(g.m) * n * k;
  ParallelFor(
      static_cast<int64_t>(products.size()) * blocks, macs >= kParallelMacs, [&](int64_t i) {
        const GroupedProduct& g = products[i / blocks];
        if (g.m == 0) return;
        Blocked8TileAt(tile, xb.data() + first[i / blocks], static_cast<const uint8_t*>(g.w), g.y,
                       n, k, static_cast<int>(i % blocks), 0, g.m);
      });
}

// x [m][k] as the INT8 tiles take it (kernel_table.h): each row quantised per k block by the
// path's quantise_row, so a row's bytes, scales and corrections never depend on the other rows.
struct Int8X {
  int8_t* rows;
  float* scales;
  int32_t* corrections;
};
void Int8Rows(const float* x, int m, int k, Int8X out) {
  const internal::KernelTable& path = Active();
  const size_t row_bytes = static_cast<size_t>(internal::Int8RowBytes(k));
  const size_t row_blocks = static_cast<size_t>(internal::Int8KBlocks(k));
  ParallelFor(m, static_cast<int64_t>(m) * k >= kParallelMacs / 4, [&](int64_t r) {
    path.quantise_row(x + static_cast<size_t>(r) * k, k, out.rows + r * row_bytes,
                      out.scales + r * row_blocks, out.corrections + r * row_blocks);
  });
}

// One call of the INT8 tile: block b, the rows [t, t + tokens) (Int8Rows). A call of many rows
// is told the next block, as Blocked8TileAt.
void Int8TileAt(const internal::KernelTable& path, const Int8X& x, const uint8_t* packed_w,
                float* y, int n, int k, int b, int t, int tokens) {
  const int64_t block_bytes = internal::Int8BlockBytes(k);
  const int c0 = b * kBlockCols;
  const uint8_t* next = b + 1 < internal::ColBlocks(n) ? packed_w + (b + 1) * block_bytes : nullptr;
  internal::BlockAhead ahead;
  if (next != nullptr && tokens >= 3 * kTokens) ahead = {.at = next, .bytes = block_bytes};
  path.int8_tile(x.rows, x.scales, x.corrections, packed_w + b * block_bytes, y, n, k, c0, t,
                 BlockGroups(n, c0), tokens, ahead);
}

// The quantised rows of the INT8 products, kept per calling thread across calls.
struct Int8Scratch {
  std::vector<int8_t> rows;
  std::vector<float> scales;
  std::vector<int32_t> corrections;
  // Room for m rows of k values.
  void Resize(int m, int k) {
    rows.resize(static_cast<size_t>(m) * internal::Int8RowBytes(k));
    scales.resize(static_cast<size_t>(m) * internal::Int8KBlocks(k));
    corrections.resize(scales.size());
  }
  // The rows from `first` on.
  Int8X From(int first, int k) {
    const size_t blocks = static_cast<size_t>(first) * internal::Int8KBlocks(k);
    return {rows.data() + static_cast<size_t>(first) * internal::Int8RowBytes(k),
            scales.data() + blocks, corrections.data() + blocks};
  }
};
Int8Scratch& Int8ScratchOfThread() {
  thread_local Int8Scratch scratch;
  return scratch;
}

}  // namespace

void PackFP8(const uint8_t* w, const float* row_scales, int n, int k, uint8_t* packed) {
  PackBlocked8(w, row_scales, internal::kFp8Unscale, Fp8Position, /*flush_subnormals=*/true, n, k,
               packed);
}

size_t PackedInt8Bytes(int n, int k) {
  return static_cast<size_t>(internal::ColBlocks(n)) * internal::Int8BlockBytes(k);
}

void PackInt8(const int8_t* w, const float* row_scales, int n, int k, uint8_t* packed) {
  const int64_t block_bytes = internal::Int8BlockBytes(k);
  const int k_blocks = internal::Int8KBlocks(k);
  ParallelFor(internal::ColBlocks(n), static_cast<int64_t>(n) * k >= kParallelMacs, [&](int64_t b) {
    uint8_t* at = packed + b * block_bytes;
    const int c0 = static_cast<int>(b) * kBlockCols;
    const int cols = std::min(kBlockCols, n - c0);
    for (int j = 0; j < k_blocks; ++j) {
      const int k0 = j * kFp8BlockK, kb = std::min(kFp8BlockK, k - k0);
      float scales[kBlockCols] = {};
      for (int c = 0; c < cols; ++c)
        scales[c] = row_scales[static_cast<size_t>(c0 + c) * k_blocks + j];
      std::memcpy(at, scales, sizeof(scales));
      at += internal::kInt8BlockHeadBytes;
      const size_t line_bytes =
          static_cast<size_t>(internal::Int8RowBytes(kb) / 4) * internal::kInt8QuadLineBytes;
      std::memset(at, internal::kInt8WOffset, line_bytes);
      for (int c = 0; c < cols; ++c) {
        const int8_t* src = w + static_cast<size_t>(c0 + c) * k + k0;
        for (int i = 0; i < kb; ++i) {
          at[(i / 4) * internal::kInt8QuadLineBytes + internal::Int8QuadPosition(c, i % 4)] =
              static_cast<uint8_t>(src[i] + internal::kInt8WOffset);
        }
      }
      at += line_bytes;
    }
  });
}

void MatMulFP8(const float* x, const uint8_t* packed_w, float* y, int m, int n, int k) {
  MatMulBlocked8(Active().fp8_tile, internal::kFp8Unscale, x, packed_w, y, m, n, k);
}

void MatMulInt8(const float* x, const uint8_t* packed_w, float* y, int m, int n, int k) {
  Int8Scratch& s = Int8ScratchOfThread();
  s.Resize(m, k);
  const Int8X xq = s.From(0, k);
  Int8Rows(x, m, k, xq);
  const internal::KernelTable& path = Active();
  ForEachTile(m, n, k, internal::ColBlocks(n), kTokenBlock,
              [&](int b, int t, int tokens, TokenBlock) {
                Int8TileAt(path, xq, packed_w, y, n, k, b, t, tokens);
              });
}

void MatMulFP8Grouped(std::span<const GroupedProduct> products, int n, int k) {
  MatMulBlocked8Grouped(Active().fp8_tile, internal::kFp8Unscale, products, n, k);
}

void MatMulInt8Grouped(std::span<const GroupedProduct> products, int n, int k) {
  std::vector<int> first(products.size() + 1, 0);
  for (size_t p = 0; p < products.size(); ++p) first[p + 1] = first[p] + products[p].m;
  Int8Scratch& s = Int8ScratchOfThread();
  s.Resize(first.back(), k);
  for (size_t p = 0; p < products.size(); ++p) {
    Int8Rows(static_cast<const float*>(products[p].x), products[p].m, k, s.From(first[p], k));
  }
  const internal::KernelTable& path = Active();
  ForEachGroupedTile(products, n, k, internal::ColBlocks(n), kTokenBlock,
                     [&](int p, int b, int t, int tokens, TokenBlock) {
                       const GroupedProduct& g = products[p];
                       Int8TileAt(path, s.From(first[p], k), static_cast<const uint8_t*>(g.w), g.y,
                                  n, k, b, t, tokens);
                     });
}

void MatMulF32(const float* x, const float* w, float* y, int m, int n, int k) {
  const internal::KernelTable& path = Active();
  ForEachTile(m, n, k, (n + kRows - 1) / kRows, kTokens, [&](int b, int t, int tokens, TokenBlock) {
    const int r0 = b * kRows;
    path.f32_tile(x, w, y, n, k, r0, t, std::min(kRows, n - r0), tokens);
  });
}

void MatMulF32Grouped(std::span<const GroupedProduct> products, int n, int k) {
  const internal::KernelTable& path = Active();
  ForEachGroupedTile(products, n, k, (n + kRows - 1) / kRows, kTokens,
                     [&](int p, int b, int t, int tokens, TokenBlock) {
                       const GroupedProduct& g = products[p];
                       const int r0 = b * kRows;
                       path.f32_tile(static_cast<const float*>(g.x), static_cast<const float*>(g.w),
                                     g.y, n, k, r0, t, std::min(kRows, n - r0), tokens);
                     });
}

void ToBF16(const float* src, uint16_t* dst, size_t n) {
  const internal::KernelTable& path = Active();
  const int64_t count = static_cast<int64_t>(n);
  constexpr int64_t kChunk = 4096;  // values per parallel chunk, a multiple of 16
  ParallelFor((count + kChunk - 1) / kChunk, count >= kParallelMacs / 4, [&](int64_t c) {
    path.to_bf16(src + c * kChunk, dst + c * kChunk, std::min(kChunk, count - c * kChunk));
  });
}

void RmsNorm(const float* x, const float* weight, float* out, int rows, int dim, float eps) {
  const internal::KernelTable& path = Active();
  ParallelFor(rows, static_cast<int64_t>(rows) * dim >= kParallelMacs / 8, [&](int64_t r) {
    path.rms_norm_row(x + static_cast<size_t>(r) * dim, weight, out + static_cast<size_t>(r) * dim,
                      dim, eps);
  });
}

void ApplyRope(float* x, int heads, int head_dim, const float* cos, const float* sin) {
  Active().apply_rope(x, heads, head_dim, cos, sin);
}

void SiluMul(const float* gate, const float* up, float* out, int n) {
  Active().silu_mul(gate, up, out, n);
}

void PagedAttention(std::span<const AttentionQuery> queries, const KvCache& cache, int layer,
                    int num_heads, float scale) {
  PD_CHECK(cache.layout().head_dim <= 16 * internal::kMaxHeadChunks);
  PD_CHECK(IsKvCacheDType(cache.layout().dtype));  // KvCache::Create refuses the others
  PageAttention(queries, cache, layer, num_heads, scale);
}

namespace {

// Writes one token's rows of component `c` ([kv_heads][head_dim] floats) into `slot` of `page`.
void StoreComponent(KvCache& cache, int layer, PageId page, int slot, KvComponent c,
                    const float* src) {
  const KvLayout& layout = cache.layout();
  const int hd = layout.head_dim;
  uint8_t* block = cache.Block(layer, page, c);
  for (int h = 0; h < layout.num_kv_heads; ++h) {
    const size_t elem = (static_cast<size_t>(h) * layout.page_tokens + slot) * hd;
    const float* s = src + static_cast<size_t>(h) * hd;
    if (layout.dtype == DType::kF32) {
      std::copy(s, s + hd, reinterpret_cast<float*>(block) + elem);
    } else {
      ToBF16(s, reinterpret_cast<uint16_t*>(block) + elem, hd);
    }
  }
}

}  // namespace

void StoreKv(KvCache& cache, int layer, PageId page, int slot, const float* k, const float* v) {
  StoreComponent(cache, layer, page, slot, KvComponent::kK, k);
  StoreComponent(cache, layer, page, slot, KvComponent::kV, v);
}

}  // namespace pdserve::kernels
