// Compute kernels of the forward pass: matrix products, RMSNorm, RoPE, SwiGLU, paged attention.
//
// Every kernel is *batch-invariant*: the value computed for one row (token) depends only on
// that row's inputs, never on how many other rows share the call or where a chunk starts. Each
// output element is accumulated in a fixed order whatever tile it falls in (BF16: one lane
// per output over the k pairs in sequence; F32: 16 lanes along the reduction dimension, then
// a fixed lane tree; attention scores: one lane per position over head_dim in sequence). This is
// what makes disaggregated and colocated serving produce bit-identical tokens (DESIGN.md §6) and
// why the matrix products are our own AVX-512 kernels rather than oneDNN's, whose reduction order
// depends on the batch size.
//
// Kernels parallelise internally with OpenMP; call them from one thread at a time. A call too
// small to split (e.g. one token's StoreKv) runs on the calling thread without opening an
// OpenMP region, so it is cheap inside a parallel loop of the caller.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kv/kv_cache.h"
#include "kv/layout.h"

namespace pdserve::kernels {

// BF16 weight matrices are repacked once, at load, into the operand layout of the BF16 product
// (64-column blocks, k in pairs; see kernels.cc). PackedBF16Elements is the packed size in
// BF16 values; PackBF16 packs w [n][k] (row-major, Hugging Face layout); UnpackRowBF16 reads
// row `row` of the original matrix back as floats (an embedding lookup in a tied lm_head).
size_t PackedBF16Elements(int n, int k);
void PackBF16(const uint16_t* w, int n, int k, uint16_t* packed);
void UnpackRowBF16(const uint16_t* packed, int n, int k, int row, float* out);

// FP8 weight matrices (float8_e4m3fn, common/dtype.h) with an F32 scale per row and per
// kFp8BlockK-wide block of k: w[r][c] = fp8[r][c] * row_scales[r][c / kFp8BlockK]. (A
// checkpoint's 128 x 128 blocks give every row of a block the block's scale; a row keeps its
// scales whatever rows it is packed with, so tensor-parallel shares and fused matrices may
// start anywhere.) Packed once, at load, by PackFP8 (64-column blocks, one byte per weight plus
// the scales; see kernel_table.h); PackedFP8Bytes is the packed size. Bytes 0x7f and 0xff (NaN)
// must not occur: the kernels would read them as 480 (the loader refuses them). A subnormal is
// packed as a zero of its sign (the BF16 dot products would read it so).
inline constexpr int kFp8BlockK = 128;
size_t PackedFP8Bytes(int n, int k);
// w [n][k] FP8 bytes (row-major, Hugging Face layout); row_scales [n][ceil(k / kFp8BlockK)].
void PackFP8(const uint8_t* w, const float* row_scales, int n, int k, uint8_t* packed);

// INT8 weight matrices: w[r][c] = int8[r][c] * row_scales[r][c / kFp8BlockK], symmetric
// (no zero point), the same grid of scales as FP8 (an F32 per row and 128-wide k block).
// Packed once by PackInt8 into 64-column blocks of quad lines (one byte per weight, offset by
// 128, plus a scale per column and k block: FP8's bytes); the products are integer dot
// products of x quantised per row and k block (kernel_table.h).
size_t PackedInt8Bytes(int n, int k);
// w [n][k] INT8 (row-major); row_scales [n][ceil(k / kFp8BlockK)].
void PackInt8(const int8_t* w, const float* row_scales, int n, int k, uint8_t* packed);

// y[m][n] = sum_k x[m][k] * w[n][k]. BF16: x is BF16 too (activations are rounded to BF16
// before a BF16 product) and w is packed by PackBF16. F32: w is [n][k] row-major. FP8: x is
// F32, rounded to BF16 inside the product (as vcvtneps2bf16 rounds), w packed by PackFP8; each
// FP8 value is widened exactly to BF16 and the products are BF16 dot products (kernel_table.h).
void MatMulBF16(const uint16_t* x, const uint16_t* packed_w, float* y, int m, int n, int k);
void MatMulF32(const float* x, const float* w, float* y, int m, int n, int k);
void MatMulFP8(const float* x, const uint8_t* packed_w, float* y, int m, int n, int k);
// INT8: x is F32, quantised inside the product to 8 bits per row and 128-wide k block (a scale
// max|x| / 127 each, so a row's values never depend on the other rows), multiplied with the
// INT8 weights in integers and scaled in F32 per k block (kernel_table.h); w packed by PackInt8.
void MatMulInt8(const float* x, const uint8_t* packed_w, float* y, int m, int n, int k);

// Several products of one shape [n][k] at once (an MoE layer's experts, each with its own rows):
// products[i].y[m][n] = products[i].x[m][k] * products[i].w^T, each exactly as the single
// product computes it (the same tiles, so the same bits), in one parallel pass over all their
// tiles instead of one OpenMP region each. x and w in the dtype of the function's name, as above.
struct GroupedProduct {
  const void* x;
  const void* w;
  float* y;
  int m;
};
void MatMulBF16Grouped(std::span<const GroupedProduct> products, int n, int k);
void MatMulF32Grouped(std::span<const GroupedProduct> products, int n, int k);
void MatMulFP8Grouped(std::span<const GroupedProduct> products, int n, int k);
void MatMulInt8Grouped(std::span<const GroupedProduct> products, int n, int k);

// Rounds n floats to BF16 (nearest even).
void ToBF16(const float* src, uint16_t* dst, size_t n);

// out[r] = x[r] / rms(x[r]) * weight, for `rows` rows of `dim`. out may alias x.
void RmsNorm(const float* x, const float* weight, float* out, int rows, int dim, float eps);

// In place on `heads` vectors of head_dim at x (one token): Hugging Face rotate_half RoPE with
// precomputed cos/sin of this token's position (head_dim/2 each).
void ApplyRope(float* x, int heads, int head_dim, const float* cos, const float* sin);

// out[i] = silu(gate[i]) * up[i] for one row; gate/up/out of length n.
void SiluMul(const float* gate, const float* up, float* out, int n);

// One query row of attention over the paged cache.
struct AttentionQuery {
  const float* q;  // [num_heads][head_dim], RoPE applied
  float* out;      // [num_heads][head_dim]
  // The sequence's block table. Queries with equal pointers are one sequence (a prefill
  // chunk), which share the reading of its K/V rows: every path reads them from the pages as
  // they are (avx512 and avx2: each tile of keys widened once for up to 8 queries).
  const PageId* pages;
  int64_t context_len;  // attends to positions [0, context_len) (causal: position + 1)
};

// Causal GQA attention of many query rows, each over its own sequence's pages in `cache` for
// `layer`. Query head h uses KV head h / (num_heads / kv_heads). Scores are scaled by `scale`.
void PagedAttention(std::span<const AttentionQuery> queries, const KvCache& cache, int layer,
                    int num_heads, float scale);

// Writes one token's K and V ([kv_heads][head_dim] floats each) into `slot` of `page`.
void StoreKv(KvCache& cache, int layer, PageId page, int slot, const float* k, const float* v);

}  // namespace pdserve::kernels
