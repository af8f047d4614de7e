#include "kv/layout.h"

#include <fmt/format.h>

namespace pdserve {

Status CheckKvCacheDType(DType t) {
  if (IsKvCacheDType(t)) return Status::Ok();
  // DTypeFlagName spells "?" for a value outside the enum (a corrupt layout).
  return Status::InvalidArgument(
      fmt::format("KV cache dtype {} is not supported (f32 or bf16)", DTypeFlagName(t)));
}

Status KvLayout::Validate() const {
  // Caps far above any real model; they keep every offset product below 2^63.
  constexpr int64_t kMaxLayers = 1 << 12, kMaxHeads = 1 << 12, kMaxHeadDim = 1 << 14;
  constexpr int64_t kMaxPageTokens = 1 << 14, kMaxPages = 1 << 26;
  constexpr uint64_t kMaxTotalBytes = uint64_t{1} << 50;
  auto in_range = [](int v, int64_t lo, int64_t hi) { return v >= lo && v <= hi; };
  if (!in_range(num_layers, 1, kMaxLayers) || !in_range(num_kv_heads, 1, kMaxHeads) ||
      !in_range(head_dim, 1, kMaxHeadDim) || !in_range(page_tokens, 1, kMaxPageTokens) ||
      !in_range(num_pages, 0, kMaxPages)) {
    return Status::InvalidArgument("KV layout out of range: " + ToString());
  }
  PD_RETURN_IF_ERROR(CheckKvCacheDType(dtype));
  // The running product is checked before each multiplication, so it never overflows.
  uint64_t bytes = elem_size();
  for (uint64_t factor : {uint64_t(head_dim), uint64_t(page_tokens), uint64_t(num_kv_heads),
                          uint64_t(num_components()), uint64_t(num_pages), uint64_t(num_layers)}) {
    if (factor != 0 && bytes > kMaxTotalBytes / factor) {
      return Status::InvalidArgument("KV layout larger than 2^50 bytes: " + ToString());
    }
    bytes *= factor;
  }
  return Status::Ok();
}

std::string KvLayout::ToString() const {
  return fmt::format("layers={} kv_heads={} head_dim={} page_tokens={} dtype={} pages={}{}",
                     num_layers, num_kv_heads, head_dim, page_tokens, DTypeFlagName(dtype),
                     num_pages, kind == KvKind::kLatent ? " latent" : "");
}

}  // namespace pdserve
