// KvLayout: where each byte of the paged KV cache lives (DESIGN.md §4). Pure arithmetic.
//
// The cache is layer-major: layer L owns one contiguous region of `num_pages` blocks. A block
// (one page of one layer) is K then V, each [kv_heads][page_tokens][head_dim] (HND), so the
// heads a tensor-parallel rank holds are one contiguous range inside K and inside V.
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
  // Byte offset of K (is_v=false) or V of head `head`, token slot `slot`, within the cache.
  size_t ElementOffset(int layer, PageId page, bool is_v, int head, int slot) const {
    return BlockOffset(layer, page) + (is_v ? half_block_bytes() : 0) + head_bytes() * head +
           static_cast<size_t>(slot) * head_dim * elem_size();
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
