#include "kv/layout.h"

#include <fmt/format.h>

namespace pdserve {

std::string KvLayout::ToString() const {
  return fmt::format("layers={} kv_heads={} head_dim={} page_tokens={} dtype={} pages={}",
                     num_layers, num_kv_heads, head_dim, page_tokens,
                     dtype == KvDType::kF32 ? "f32" : "bf16", num_pages);
}

}  // namespace pdserve
