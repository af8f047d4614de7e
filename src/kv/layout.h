// KvLayout: where each byte of the paged KV cache lives (DESIGN.md §4). Pure arithmetic.
//
// The cache is layer-major: layer L owns one contiguous region of `num_pages` blocks. A block
// (one page of one layer) holds the layout's components (KvComponent) one after the other, each
// [kv_heads][page_tokens][head_dim] (HND), so the heads a tensor-parallel rank holds are one
// contiguous range inside each component. Where a component lies is ComponentOffset and
// ElementOffset alone: callers (kernels, transfer plan, messenger) name the component and walk
// components(), never assume an order or a count.
// Plain value type; thread-compatible.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "common/dtype.h"
#include "common/status.h"

namespace pdserve {

using PageId = int32_t;

// The element types a KV cache may hold (the attention kernels read F32 and BF16 pages).
inline bool IsKvCacheDType(DType t) { return t == DType::kF32 || t == DType::kBF16; }
// Ok for F32 and BF16; otherwise an InvalidArgument that names the type.
Status CheckKvCacheDType(DType t);

// What a cache page holds per token, in the order the components lie in a block. A GQA cache
// holds K and V; a latent cache (MLA) one row per token, c_kv then k_pe, as one "head" that
// every TP rank holds whole.
enum class KvComponent : uint8_t { kK, kV, kLatent };

// The kind of cache a model keeps: its components (KvLayout::components()).
enum class KvKind : uint8_t { kGqa, kLatent };

struct KvLayout {
  int num_layers = 0;
  int num_kv_heads = 0;  // heads held by this cache (one rank's share under TP)
  int head_dim = 0;
  int page_tokens = 16;
  DType dtype = DType::kBF16;  // F32 or BF16 (Validate checks)
  int num_pages = 0;
  KvKind kind = KvKind::kGqa;

  // The components of this cache's blocks, in block order.
  std::span<const KvComponent> components() const {
    return kind == KvKind::kLatent ? std::span<const KvComponent>(kLatentComponents)
                                   : std::span<const KvComponent>(kGqaComponents);
  }
  int num_components() const { return static_cast<int>(components().size()); }

  size_t elem_size() const { return DTypeSize(dtype); }
  // Bytes of one head's slice of one component of one page: [page_tokens][head_dim].
  size_t head_bytes() const { return static_cast<size_t>(page_tokens) * head_dim * elem_size(); }
  // Bytes of one component of one page of one layer: [kv_heads][page_tokens][head_dim].
  size_t component_bytes() const { return head_bytes() * num_kv_heads; }
  // Bytes of one page of one layer, every component: the stride from one page to the next.
  size_t block_bytes() const { return num_components() * component_bytes(); }
  size_t layer_bytes() const { return block_bytes() * num_pages; }
  size_t total_bytes() const { return layer_bytes() * num_layers; }

  // Byte offset of page `page`'s block in layer `layer`.
  size_t BlockOffset(int layer, PageId page) const {
    return layer_bytes() * layer + block_bytes() * page;
  }
  // Byte offset of component `c` of page `page`'s block in layer `layer`.
  size_t ComponentOffset(int layer, PageId page, KvComponent c) const {
    return BlockOffset(layer, page) + component_bytes() * ComponentIndex(c);
  }
  // Byte offset of component `c` of head `head`, token slot `slot`, within the cache.
  size_t ElementOffset(int layer, PageId page, KvComponent c, int head, int slot) const {
    return ComponentOffset(layer, page, c) + head_bytes() * head +
           static_cast<size_t>(slot) * head_dim * elem_size();
  }
  // The same for a GQA cache's K (is_v false) or V: shorthand for tests that walk both.
  size_t ElementOffset(int layer, PageId page, bool is_v, int head, int slot) const {
    return ElementOffset(layer, page, is_v ? KvComponent::kV : KvComponent::kK, head, slot);
  }
  int PagesForTokens(int64_t tokens) const {
    return static_cast<int>((tokens + page_tokens - 1) / page_tokens);
  }

  // Ok if every field is in range (positive sizes, a KV dtype) and total_bytes() cannot
  // overflow; layouts that come from outside (a peer's handshake) are checked with it.
  Status Validate() const;

  std::string ToString() const;
  friend bool operator==(const KvLayout&, const KvLayout&) = default;

 private:
  static constexpr std::array<KvComponent, 2> kGqaComponents = {KvComponent::kK, KvComponent::kV};
  static constexpr std::array<KvComponent, 1> kLatentComponents = {KvComponent::kLatent};
  // `c`'s place in components(): K and V in enum order; a latent cache's only component first.
  static size_t ComponentIndex(KvComponent c) {
    return c == KvComponent::kLatent ? 0 : static_cast<size_t>(c);
  }
};

}  // namespace pdserve
