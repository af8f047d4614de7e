// Internals of src/kernels, shared by the kernel paths (kernels_avx512.cc and
// kernels_avx512_attention.cc, kernels_avx2.cc, kernels_generic.cc, the AMX files) and the code
// common to them (kernels.cc, dispatch.cc). Not for use outside src/kernels, but for the kernels'
// own tests (tests/kernels/attend_pages_test.cc calls a path's table to compare its two attention
// routes). Everything here is safe from any thread; KernelTable entries follow the threading rules
// of kernels.h.
//
// One rule keeps the paths apart: an ISA file is compiled with its own -m flags, so nothing it
// defines may be an inline function or template that other files define too, or the linker may
// keep the ISA file's copy for everyone and run AVX-512 code on an AVX2 CPU. Hence this header
// holds constants and declarations of functions defined in kernels.cc (baseline x86-64) only;
// the ISA files keep their code in an unnamed namespace and use no out-of-line std templates
// (a ctest checks the symbols of their objects).
#pragma once

#include <cstddef>
#include <cstdint>

namespace pdserve::kernels::internal {

// Rows of x per tile of the matrix-product walker, and rows kept in L2 while every weight
// block streams past (DESIGN.md §6: tiles never change a value, only the speed).
constexpr int kTokens = 6;
constexpr int kTokenBlock = 16 * kTokens;
// Weight rows per tile of the F32 product.
constexpr int kRows = 4;
// Below this many multiply-adds a kernel runs on the calling thread only.
constexpr int64_t kParallelMacs = int64_t{1} << 18;

// Packed BF16 layout (PackBF16): 64-column blocks; within a block, for every pair p of the k
// dimension, 4 groups of 16 columns, each group 16 x 2 BF16 values W[c][2p], W[c][2p+1] side by
// side (one 32-bit word per column: even element low, odd element high). Each output column
// accumulates its own dot product over the pairs in order, odd product then even product (the
// order of vdpbf16ps), so its value depends only on its row of x and column of W.
constexpr int kGroupCols = 16;
constexpr int kBlockGroups = 4;
constexpr int kBlockCols = kGroupCols * kBlockGroups;
constexpr int kPairElems = 2 * kBlockCols;  // BF16 values of one k pair in one block

// Packed FP8 layout (PackFP8): 64-column blocks as above; within a block, for each k block j
// (kFp8BlockK = 128 values of k, the last one possibly shorter) first the 64 columns' scales of
// block j (F32 in column order: the row's scale times 2^60), then one 128-byte pair line per k
// pair of block j (an odd last pair's odd bytes zero): the 64 columns' bytes of k indices 2p
// (even) and 2p + 1 (odd), at Fp8PairPosition. Columns past n hold zero bytes and zero scales. A
// block is one contiguous stream of Fp8BlockBytes(k) bytes, a multiple of 64.
//
// The FP8 products are BF16 dot products, as the BF16 product's (vdpbf16ps): the kernels take x
// times 2^60 rounded to BF16 (kernels.cc's Blocked8Rows; a BF16 denormal as a zero, as
// vdpbf16ps reads it) and widen every byte exactly to a BF16: a byte s|eeee|mmm placed at bits
// 15 and 10..4 of a BF16 (the rest zero) is the BF16 fp8 * 2^-120, two 16-bit shifts and a
// mask; the 2^-120 is undone by x's and the scales' 2^60. An FP8 subnormal would be a BF16
// denormal, which vdpbf16ps reads as zero, so PackFP8 stores subnormals as zeros of their sign
// (|w| < 2^-6 of the block's unit, below 1/28672 of its largest value): every path then sees
// the same values.
//
// FP8 order (every path, bit for bit): for each output (row t of x, column c) and each k block j
// in order, part = 0 and for each pair p of the block in order part = part + xo * wo, then
// part = part + xe * we (odd then even, exact products: vdpbf16ps); then
// acc = fma(part, scale[c][j], acc), acc starting at 0. So a value depends only on its row of x
// and column of W, whatever the tile, batch, thread count or path (avx512 widens each line in
// registers for a few rows, a k block's panel once into BF16 for up to a token block, a strip
// of k blocks (below) for more: the same values in the same order; acc may wait in y between
// strips, an exact F32 store and load). As for the BF16 product, the paths without vdpbf16ps (avx2,
// generic) differ from it only where it would flush a denormal sum to zero: a partial sum below
// 2^-66 of the unscaled values, which no activation of a model comes near.
constexpr int kFp8BlockK = 128;  // kernels::kFp8BlockK (kernels.cc checks they agree)
constexpr int kFp8ScaleBytes = kBlockCols * static_cast<int>(sizeof(float));
constexpr int kPairLineBytes = 2 * kBlockCols;  // one byte per column and k index of a pair
// FP8: in half h = c / 32 of the line, 32-bit word d = c % 16 holds the bytes of columns
// 32h + d and 32h + 16 + d, even then odd: [c even, c + 16 even, c odd, c + 16 odd]; so one
// 16-bit shift-and-mask pair per half gives the BF16 pairs of groups 2h and 2h + 1.
constexpr int Fp8PairPosition(int c, int odd) {
  return 64 * (c / 32) + 4 * (c % kGroupCols) + 2 * odd + (c / kGroupCols) % 2;
}
// The BF16 bits that keep an FP8 byte placed at bits 15 and 10..4 (see above).
constexpr uint16_t kFp8BF16Mask = 0x87f0;
// FP8 x and scales are taken times 2^60 (see above).
constexpr float kFp8Unscale = 0x1p60f;
// Products of more than kTokenBlock rows widen each k block once for all their rows: a block's
// lines kFp8StripK values of k at a time into a *strip* of BF16 panels (the packed BF16 layout,
// kFp8PanelElems values per k block), which every tile of rows then reads from L2 (kernels.cc
// gives each thread a strip of kFp8StripElems values, 64-byte aligned).
constexpr int kFp8StripK = 2048;
constexpr int kFp8PanelElems = kFp8BlockK / 2 * kPairElems;
constexpr int kFp8StripElems = kFp8StripK / kFp8BlockK * kFp8PanelElems;
static_assert(kFp8StripK % kFp8BlockK == 0);

// Packed INT8 layout (PackInt8): integer dot products of 8-bit weights and 8-bit x (vpdpbusd on
// avx512: 4 unsigned bytes of w times 4 signed bytes of x summed into an int32 lane). 64-column
// blocks; within a block, for each k block j (128 values of k, the last possibly shorter): the
// 64 columns' F32 weight scales, then one 256-byte quad line per 4 values of k of block j (a
// short last quad padded): column c's bytes of k indices 4q..4q+3 at bytes 4c..4c+3, so a group
// of 16 columns is one 64-byte vector and each 32-bit lane one column. A weight w (-127..127) is
// stored as the byte w + kInt8WOffset (1..255; padding and columns past n: kInt8WOffset, a zero
// weight; their scales zero). A block is Int8BlockBytes(k) bytes, a multiple of 64. (The offset
// is undone per row of x, not per column: kInt8WOffset * (the sum of the row's q over block j)
// is one int32 per row and k block, so the packed matrix holds no per-column correction.)
//
// x is quantised per row and k block (Int8Rows, the path's quantise_rows): a = max |x| over the
// block's values; sx = a / 127 and q = x * (127 / a) rounded to nearest even (within +-127; a
// block with a < kInt8TinyBlock has sx = 0 and q = 0; a block holding an inf or NaN has
// sx = NaN and q = 0, so its outputs are NaN); stored as the signed byte q, rows of
// Int8RowBytes(k) bytes (pad: 0), sx as [rows][k blocks] F32 and the row's correction
// kInt8WOffset * sum(q) as [rows][k blocks] int32.
//
// Order (every path, bit for bit): for each output (row t, column c) and each k block j in
// order, s = sum over the block of (w + 128) * q in int32 (exact, so any order: |s| <= 128 *
// 255 * 127 < 2^23), d = s - corr[t][j] (= sum of w * q, exact, |d| <= 128 * 127 * 127 < 2^21,
// so exact in F32), acc = fma(float(d), scale[c][j] * sx[t][j], acc) (the product of the scales
// rounded to F32 first), acc starting at 0. Integers are exact and the F32 steps are the same on
// every path, so every path computes the same bits (avx512: vpdpbusd; avx2: int16 products,
// vpmaddwd; generic: int loops), whatever the tile, batch or thread count.
constexpr int kInt8QuadLineBytes = 4 * kBlockCols;
constexpr int kInt8BlockHeadBytes = kBlockCols * static_cast<int>(sizeof(float));
constexpr int kInt8WOffset = 128;
// Below this block maximum |x| a block of x quantises to zeros (127 / a stays finite).
constexpr float kInt8TinyBlock = 0x1p-96f;
constexpr int Int8QuadPosition(int c, int i) { return 4 * c + i; }

// Attention: head_dim <= 16 * kMaxHeadChunks; at most kMaxGroup query heads share one pass.
constexpr int kMaxHeadChunks = 16;
constexpr int kMaxGroup = 8;

// Attention straight from the KV pages (KernelTable::attend_pages). One KV head of one
// sequence: the K (V) rows of positions [i * page_tokens, (i + 1) * page_tokens) start at k[i]
// (v[i]), row-major [page_tokens][head_dim], BF16 or F32 elements.
struct HeadPages {
  const void* const* k;
  const void* const* v;
  int page_tokens;
  bool bf16;  // else F32
};
// One query of a run: its query heads that share the KV head (q, out: [heads][head_dim]) attend
// to positions [0, ctx). Over a BF16 cache the scores are BF16 dot products (vdpbf16ps on
// avx512), so q is taken rounded to BF16 (RoundQueryHeads): q holds the rounded values as
// floats, q_bf16 the same values as BF16, [heads][QueryPairs(head_dim) * 2], each head's odd
// tail padded with a zero. Over an F32 cache q is as computed and q_bf16 unused.
struct PageQuery {
  const float* q;
  const uint16_t* q_bf16;
  float* out;
  int64_t ctx;
};
// Pairs of head_dim in a row of PageQuery::q_bf16: (hd + 1) / 2.
int QueryPairs(int hd);
// `heads` rows of head_dim values of q -> rounded (floats) and pairs (PageQuery::q_bf16): round
// to nearest even, and a value that rounds to a BF16 denormal becomes a zero of its sign (the
// instruction treats denormal inputs as zero; so does every path, by never seeing one).
void RoundQueryHeads(const float* q, int heads, int hd, float* rounded, uint16_t* pairs);

// The share of the next weight block that a tile brings toward L2 while it computes: `bytes`
// from `at` (none: null). Only a hint for the memory system; it never changes a value.
struct BlockAhead {
  const void* at = nullptr;
  int64_t bytes = 0;
};

// One kernel path: the ISA-specific pieces behind the public functions of kernels.h. The
// walkers, packing and scratch management that do not depend on the ISA live in kernels.cc.
struct KernelTable {
  const char* name;
  // One tile of MatMulBF16: `groups` 16-column groups of the packed block at `block` (first
  // column c0) x `tokens` rows of x from t0; tokens <= packed_tile_tokens. A path may spread
  // software prefetches of `ahead` over the tile's k pairs, or ignore it.
  void (*packed_tile)(const uint16_t* x, const uint16_t* block, float* y, int n, int k, int c0,
                      int t0, int groups, int tokens, BlockAhead ahead);
  // Rows of x per packed_tile call (its `tokens` never exceed it): kTokens for the vector
  // paths, 16 for the AMX tiles.
  int packed_tile_tokens;
  // One tile of MatMulF32: weight rows [r0, r0 + rows) x rows [t0, t0 + tokens) of x; rows <=
  // kRows, tokens <= kTokens. Each output sums 16 lanes (lane j: elements j, j + 16, ...) with
  // FMA, then lane i + lane i+8, +4, +2, +1.
  void (*f32_tile)(const float* x, const float* w, float* y, int n, int k, int r0, int t0, int rows,
                   int tokens);
  // One tile of MatMulFP8: `groups` 16-column groups of the packed FP8 block at `block` (first
  // column c0) x `tokens` rows of x from t0, any number of them (the path tiles them as it
  // likes), in the order stated with the layout above. x: rows of 2 * Pairs(k) BF16 values as
  // Blocked8Rows gives them. `ahead`: the next block (whole), for many rows. `strip`: scratch of
  // kFp8StripElems BF16 values (64-byte aligned) when tokens > kTokenBlock, else null.
  void (*fp8_tile)(const uint16_t* x, const uint8_t* block, float* y, int n, int k, int c0, int t0,
                   int groups, int tokens, BlockAhead ahead, uint16_t* strip);
  // One tile of MatMulInt8: the packed INT8 layout above, x quantised by quantise_rows (rows of
  // Int8RowBytes(k) bytes, x_scales and x_corrections [rows][Int8KBlocks(k)]), tokens <=
  // kTokenBlock, in the order stated with the layout.
  void (*int8_tile)(const int8_t* xq, const float* x_scales, const int32_t* x_corrections,
                    const uint8_t* block, float* y, int n, int k, int c0, int t0, int groups,
                    int tokens, BlockAhead ahead);
  // x of the INT8 products: one row of k values quantised per k block as stated with the INT8
  // layout (bytes q into xq, Int8RowBytes(k) of them; scales into x_scales, the corrections
  // kInt8WOffset * sum(q) into x_corrections). On the calling thread.
  void (*quantise_row)(const float* x, int k, int8_t* xq, float* x_scales, int32_t* x_corrections);
  // F32ToBF16 of n values on the calling thread.
  void (*to_bf16)(const float* src, uint16_t* dst, int64_t n);
  // x of the FP8 products (kernels.cc's Blocked8Rows): n values times `factor` (a power of
  // two), each rounded to BF16 as vcvtneps2bf16 rounds it: a denormal (below 2^-126) as a zero
  // of its sign, else to nearest even; NaN stays NaN. On the calling thread.
  void (*to_bf16_daz)(const float* src, float factor, uint16_t* dst, int64_t n);
  // One row of RmsNorm (16-lane FMA sum of squares, the same lane tree).
  void (*rms_norm_row)(const float* x, const float* weight, float* out, int dim, float eps);
  void (*apply_rope)(float* x, int heads, int head_dim, const float* cos, const float* sin);
  void (*silu_mul)(const float* gate, const float* up, float* out, int n);
  // Attention of `count` queries of one sequence (a run of a prefill chunk, or a decode query)
  // and one KV head, `heads` query heads each: softmax(q . K^T * scale) . V over positions
  // [0, ctx) of each query, K and V read from the pages as they are, without copying rows out.
  // Every path computes the generic path's values bit for bit, whatever the run, the page size
  // and the tiles (kernels_generic.cc's AttendHead spells the order out). A score sums over d
  // with FMA, then is scaled; the softmax maximum and sum take 16 lanes by position mod 16 and
  // the lane tree; each element of the V sum adds its positions in order. Over a BF16 cache
  // both products are BF16 dot products, as vdpbf16ps computes them: q and the softmax
  // numerators are rounded to BF16 (a numerator below 2^-126 weighs 0, as vcvtneps2bf16 reads
  // it: kernels_generic.cc's WeightBF16), and the sums go pair by pair (elements d, d + 1 of a
  // score; positions p, p + 1 of the V sum), the odd one's product first. The SIMD paths transpose
  // a tile of keys at a time (8 positions on avx2, 16 on avx512) for every query and head of the
  // run. tests/kernels/attend_pages_test.cc compares each path with generic.
  // scores: count * heads * stride floats of scratch (stride: the longest ctx rounded up to 16).
  void (*attend_pages)(const PageQuery* queries, int count, const HeadPages& kv, int hd,
                       float scale, int heads, float* scores);
};

// The paths compiled into this binary (the x86 ones only on x86-64), defined in their files.
extern const KernelTable kGenericKernels;
#if defined(__x86_64__)
extern const KernelTable kAvx2Kernels;
extern const KernelTable kAvx512Kernels;
// kAvx512Kernels.attend_pages, defined apart in kernels_avx512_attention.cc.
void Avx512AttendPages(const PageQuery* queries, int count, const HeadPages& kv, int hd,
                       float scale, int heads, float* scores);
// AMX tile products (kernels_amx.cc): name and packed_tile* only; dispatch.cc adds the rest.
extern const KernelTable kAmxKernels;
#endif
// The same kernel on the software model of the tiles (kernels_amx_model.cc, amx_model.h); name
// and packed_tile* only.
extern const KernelTable kAmxModelKernels;

// The selected path (dispatch.cc); selects the best one this CPU supports on first use.
const KernelTable& Active();

// Exact sum of 16 values in the lane tree of _mm512_reduce_add_ps: lane i + lane i+8, then
// +4, +2, +1 (for paths that reduce outside registers).
float SumLaneTree16(const float* v);

// Pairs of the k dimension and 64-column blocks of a packed matrix.
int Pairs(int k);
int ColBlocks(int n);
// Bytes of one 64-column block of a packed FP8 matrix of k columns.
int64_t Fp8BlockBytes(int k);
// INT8: k blocks, bytes of a quantised row of x, bytes of one 64-column block.
int Int8KBlocks(int k);
int Int8RowBytes(int k);
int64_t Int8BlockBytes(int k);

}  // namespace pdserve::kernels::internal
