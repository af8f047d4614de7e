// KvLayout: where each byte of the paged KV cache lives (DESIGN.md §4). Pure arithmetic.
//
// The cache is layer-major: layer L owns one contiguous region of `num_pages` blocks. A block
// (one page of one layer) is K then V, each [kv_heads][one head's slice] (HND at the level of
// heads), so the heads a tensor-parallel rank holds are one contiguous range inside K and inside
// V. Inside a head's slice:
//   V: [page_tokens][head_dim] elements, a token's row after the other;
//   K: [key_words][page_tokens] 32-bit words, word w of every token slot together: word w of a
//      slot is its elements 2w and 2w + 1 (BF16, the lower address the even element) or its
//      element w (F32).
// K is kept transposed by words because attention multiplies a query with 16 (8 on avx2)
// positions' keys at once, one 32-bit word of head_dim each: with rows, every key tile had to
// be transposed first (a sixth of attention's time at batch 32 x 2048); now a page of 16 slots
// holds each word of a tile as one 64-byte line. Both slices are page_tokens * head_dim
// elements, so the transfer plan moves heads without knowing what is inside them.
// Plain value type; thread-compatible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/dtype.h"
#include "common/status.h"

namespace pdserve {

using PageId = int32_t;

// The element types a KV cache may hold (the attention kernels read F32 and BF16 pages).
inline bool IsKvCacheDType(DType t) { return t == DType::kF32 || t == DType::kBF16; }
// Ok for F32 and BF16; otherwise an InvalidArgument that names the type.
Status CheckKvCacheDType(DType t);

struct KvLayout {
  int num_layers = 0;
  int num_kv_heads = 0;  // heads held by this cache (one rank's share under TP)
  int head_dim = 0;
  int page_tokens = 16;
  DType dtype = DType::kBF16;  // F32 or BF16 (Validate checks)
  int num_pages = 0;

  size_t elem_size() const { return DTypeSize(dtype); }
  // Bytes of one head's slice of one page: [page_tokens][head_dim].
  size_t head_bytes() const { return static_cast<size_t>(page_tokens) * head_dim * elem_size(); }
  // Bytes of K (or V) of one page of one layer: [kv_heads][page_tokens][head_dim].
  size_t half_block_bytes() const { return head_bytes() * num_kv_heads; }
  // Bytes of one page of one layer, K and V.
  size_t block_bytes() const { return 2 * half_block_bytes(); }
  size_t layer_bytes() const { return block_bytes() * num_pages; }
  size_t total_bytes() const { return layer_bytes() * num_layers; }

  // Byte offset of page `page`'s block in layer `layer`.
  size_t BlockOffset(int layer, PageId page) const {
    return layer_bytes() * layer + block_bytes() * page;
  }
  // Byte offset of head `head`'s slice of K (is_v=false) or V of a page, within the cache.
  size_t HeadOffset(int layer, PageId page, bool is_v, int head) const {
    return BlockOffset(layer, page) + (is_v ? half_block_bytes() : 0) + head_bytes() * head;
  }
  // 32-bit words of a token's K (head_dim even where BF16: Validate).
  int key_words() const { return static_cast<int>(head_dim * elem_size() / 4); }
  // Byte offset, within a head's slice of K, of token slot `slot`'s word `word`.
  size_t KeyWordOffset(int word, int slot) const {
    return (static_cast<size_t>(word) * page_tokens + slot) * 4;
  }
  // Byte offset, within a head's slice of V, of token slot `slot`'s row.
  size_t ValueRowOffset(int slot) const {
    return static_cast<size_t>(slot) * head_dim * elem_size();
  }
  int PagesForTokens(int64_t tokens) const {
    return static_cast<int>((tokens + page_tokens - 1) / page_tokens);
  }

  // Ok if every field is in range (positive sizes, a KV dtype) and total_bytes() cannot
  // overflow; layouts that come from outside (a peer's handshake) are checked with it.
  Status Validate() const;

  std::string ToString() const;
  friend bool operator==(const KvLayout&, const KvLayout&) = default;
};

}  // namespace pdserve
