#include "kv/transfer_plan.h"

#include <algorithm>

#include <fmt/format.h>

namespace pdserve {
namespace {

// SplitMix64's output function: a fixed, well-mixed map from the request seed to the replica
// offset, identical on every host (both sides must compute the same choice).
uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

Status CheckSide(const KvSideLayout& side, const char* name) {
  if (side.shards.tp_size() == 0) {
    return Status::InvalidArgument(fmt::format("{} side has no ranks", name));
  }
  if (side.ranks.size() != static_cast<size_t>(side.shards.tp_size())) {
    return Status::InvalidArgument(fmt::format("{} side has {} rank layouts for {} shards", name,
                                               side.ranks.size(), side.shards.tp_size()));
  }
  for (int r = 0; r < side.shards.tp_size(); ++r) {
    const KvLayout& l = side.ranks[r];
    PD_RETURN_IF_ERROR(l.Validate().WithContext(fmt::format("{} rank {}", name, r)));
    if (l.num_kv_heads != side.shards.heads(r).size()) {
      return Status::InvalidArgument(
          fmt::format("{} rank {}: layout has {} KV heads but the shard layout gives it {}", name,
                      r, l.num_kv_heads, side.shards.heads(r).size()));
    }
  }
  return Status::Ok();
}

// Every rank of both sides must agree with `ref` (source rank 0) on what shapes a page.
Status CheckCompatible(const KvLayout& ref, const KvLayout& l, const char* name, int rank) {
  auto mismatch = [&](const char* field, auto want, auto got) {
    return Status::InvalidArgument(
        fmt::format("KV layouts differ: {} is {} on source rank 0 but {} on {} rank {}", field,
                    want, got, name, rank));
  };
  if (l.num_layers != ref.num_layers) return mismatch("num_layers", ref.num_layers, l.num_layers);
  if (l.head_dim != ref.head_dim) return mismatch("head_dim", ref.head_dim, l.head_dim);
  if (l.page_tokens != ref.page_tokens) {
    return mismatch("page_tokens", ref.page_tokens, l.page_tokens);
  }
  if (l.dtype != ref.dtype) {
    return mismatch("dtype", DTypeFlagName(ref.dtype), DTypeFlagName(l.dtype));
  }
  return Status::Ok();
}

PageId MinPages(const KvSideLayout& side) {
  PageId pages = side.ranks[0].num_pages;
  for (const KvLayout& l : side.ranks) pages = std::min(pages, l.num_pages);
  return pages;
}

}  // namespace

TransferPlan::TransferPlan(KvSideLayout source, KvSideLayout destination)
    : source_(std::move(source)),
      destination_(std::move(destination)),
      source_pages_(MinPages(source_)),
      destination_pages_(MinPages(destination_)) {}

Result<TransferPlan> TransferPlan::Create(KvSideLayout source, KvSideLayout destination) {
  PD_RETURN_IF_ERROR(CheckSide(source, "source"));
  PD_RETURN_IF_ERROR(CheckSide(destination, "destination"));
  if (source.shards.total_kv_heads() != destination.shards.total_kv_heads()) {
    return Status::InvalidArgument(fmt::format("source model has {} KV heads, destination {}",
                                               source.shards.total_kv_heads(),
                                               destination.shards.total_kv_heads()));
  }
  const KvLayout& ref = source.ranks[0];
  for (int r = 0; r < source.shards.tp_size(); ++r) {
    PD_RETURN_IF_ERROR(CheckCompatible(ref, source.ranks[r], "source", r));
  }
  for (int r = 0; r < destination.shards.tp_size(); ++r) {
    PD_RETURN_IF_ERROR(CheckCompatible(ref, destination.ranks[r], "destination", r));
  }
  return TransferPlan(std::move(source), std::move(destination));
}

std::vector<TransferPlan::Route> TransferPlan::Routes(uint64_t seed) const {
  const KvShardLayout& src = source_.shards;
  const KvShardLayout& dst = destination_.shards;
  const uint64_t offset = SplitMix64(seed);
  std::vector<Route> routes;
  for (int d = 0; d < dst.tp_size(); ++d) {
    const HeadRange want = dst.heads(d);
    const uint64_t replica = static_cast<uint64_t>(dst.replica_index(d));
    for (int g = 0; g < src.num_groups(); ++g) {
      const HeadRange have = src.group_heads(g);
      const int begin = std::max(want.begin, have.begin), end = std::min(want.end, have.end);
      if (begin >= end) continue;
      const std::vector<int>& replicas = src.group_ranks(g);
      const int s = replicas[(offset % replicas.size() + replica) % replicas.size()];
      routes.push_back(
          Route{.src_rank = s,
                .dst_rank = d,
                .src_head = begin - have.begin,
                .dst_head = begin - want.begin,
                .num_heads = end - begin,
                .whole_blocks = have == HeadRange{begin, end} && want == HeadRange{begin, end}});
    }
  }
  return routes;
}

Status TransferPlan::CheckPages(std::span<const PagePair> pages, int layer) const {
  if (layer < 0 || layer >= num_layers()) {
    return Status::InvalidArgument(
        fmt::format("layer {} out of range (model has {})", layer, num_layers()));
  }
  std::vector<PageId> dst_pages;
  dst_pages.reserve(pages.size());
  for (const PagePair& p : pages) {
    if (p.src < 0 || p.src >= source_pages_) {
      return Status::InvalidArgument(
          fmt::format("source page {} out of range (source has {})", p.src, source_pages_));
    }
    if (p.dst < 0 || p.dst >= destination_pages_) {
      return Status::InvalidArgument(fmt::format(
          "destination page {} out of range (destination has {})", p.dst, destination_pages_));
    }
    dst_pages.push_back(p.dst);
  }
  std::sort(dst_pages.begin(), dst_pages.end());
  const auto dup = std::adjacent_find(dst_pages.begin(), dst_pages.end());
  if (dup != dst_pages.end()) {
    return Status::InvalidArgument(fmt::format("destination page {} listed twice", *dup));
  }
  return Status::Ok();
}

Status TransferPlan::AppendLayerWrites(std::span<const PagePair> pages, int layer, uint64_t seed,
                                       std::vector<KvWrite>* out) const {
  PD_RETURN_IF_ERROR(CheckPages(pages, layer));
  const std::vector<Route> routes = Routes(seed);
  out->reserve(out->size() + source_.ranks[0].num_components() * routes.size() * pages.size());
  for (const PagePair& p : pages) {
    for (const Route& r : routes) {
      const KvLayout& s = source_.ranks[r.src_rank];
      const KvLayout& d = destination_.ranks[r.dst_rank];
      if (r.whole_blocks) {
        out->push_back(KvWrite{.src_rank = r.src_rank,
                               .src_offset = s.BlockOffset(layer, p.src),
                               .dst_rank = r.dst_rank,
                               .dst_offset = d.BlockOffset(layer, p.dst),
                               .length = s.block_bytes()});
        continue;
      }
      for (KvComponent c : s.components()) {
        out->push_back(KvWrite{.src_rank = r.src_rank,
                               .src_offset = s.ElementOffset(layer, p.src, c, r.src_head, 0),
                               .dst_rank = r.dst_rank,
                               .dst_offset = d.ElementOffset(layer, p.dst, c, r.dst_head, 0),
                               .length = s.head_bytes() * static_cast<uint64_t>(r.num_heads)});
      }
    }
  }
  return Status::Ok();
}

Result<std::vector<KvWrite>> TransferPlan::LayerWrites(std::span<const PagePair> pages, int layer,
                                                       uint64_t seed) const {
  std::vector<KvWrite> writes;
  PD_RETURN_IF_ERROR(AppendLayerWrites(pages, layer, seed, &writes));
  return writes;
}

std::vector<uint64_t> TransferPlan::ExpectedWritesPerRank(size_t num_pages, uint64_t seed) const {
  std::vector<uint64_t> per_rank(destination_.shards.tp_size(), 0);
  for (const Route& r : Routes(seed)) {
    const int components = source_.ranks[r.src_rank].num_components();
    per_rank[r.dst_rank] += uint64_t(r.writes_per_page(components)) * num_pages * num_layers();
  }
  return per_rank;
}

uint64_t TransferPlan::ExpectedBytes(size_t num_pages, uint64_t seed) const {
  uint64_t per_page_layer = 0;
  for (const Route& r : Routes(seed)) {
    const KvLayout& s = source_.ranks[r.src_rank];
    // As AppendLayerWrites: one whole block, or each component of the heads' range.
    per_page_layer +=
        r.whole_blocks ? s.block_bytes()
                       : s.num_components() * s.head_bytes() * static_cast<uint64_t>(r.num_heads);
  }
  return per_page_layer * num_pages * static_cast<uint64_t>(num_layers());
}

uint64_t TransferPlan::ExpectedWrites(size_t num_pages, uint64_t seed) const {
  uint64_t total = 0;
  for (uint64_t n : ExpectedWritesPerRank(num_pages, seed)) total += n;
  return total;
}

}  // namespace pdserve
