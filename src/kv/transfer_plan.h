// TransferPlan: which bytes of which source (prefill) rank go to which destination (decode)
// rank for a request's pages and one layer (DESIGN.md §3.4, §4). Pure function of the two
// sides' layouts, the page pairs, the layer and the request's seed, so the prefill side's
// writes and the decode side's expected count come from the same code and cannot disagree.
//
// A write moves one contiguous byte range: the overlap of a source rank's heads and a
// destination rank's heads, for each component (KvLayout::components(): K and V) of one page
// (HND keeps a head range of one component contiguous). When both ranks hold exactly the
// overlap, the components are adjacent on both sides and move as one write. When a side has
// replica groups, the request's seed picks which source replica serves each destination replica
// (see TransferPlan::Create).
//
// Immutable after Create: every method is const and safe from any thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "kv/layout.h"
#include "kv/shard_layout.h"

namespace pdserve {

// One side of a transfer: how its ranks shard the heads, and each rank's cache layout
// (num_kv_heads of rank r == shards.heads(r).size()).
struct KvSideLayout {
  KvShardLayout shards;
  std::vector<KvLayout> ranks;
  friend bool operator==(const KvSideLayout&, const KvSideLayout&) = default;
};

// A request's page `src` on the source side holds what goes to page `dst` on the destination.
struct PagePair {
  PageId src = 0;
  PageId dst = 0;
};

// One RMA write; offsets are within the named rank's cache region (KvLayout offsets).
struct KvWrite {
  int src_rank = 0;
  uint64_t src_offset = 0;
  int dst_rank = 0;
  uint64_t dst_offset = 0;
  uint64_t length = 0;
  friend bool operator==(const KvWrite&, const KvWrite&) = default;
};

class TransferPlan {
 public:
  // Checks that the sides can exchange KV: same model heads, layers, head_dim, page_tokens
  // and dtype on every rank, and each rank's layout matching its shard. InvalidArgument names
  // the first mismatch with both values.
  //
  // Replica choice: a request's seed gives an offset u = SplitMix64(seed); destination rank d
  // (replica j of its group) takes each head range from source replica (u + j) mod n of the
  // source group holding it (n replicas). So each destination replica is served by one source
  // copy, destination replicas use different copies, and over requests every source rank sends.
  static Result<TransferPlan> Create(KvSideLayout source, KvSideLayout destination);

  // Appends the writes of `layer` for `pages` to *out (nothing on error). InvalidArgument for
  // a layer or page id out of range or a destination page listed twice.
  Status AppendLayerWrites(std::span<const PagePair> pages, int layer, uint64_t seed,
                           std::vector<KvWrite>* out) const;
  Result<std::vector<KvWrite>> LayerWrites(std::span<const PagePair> pages, int layer,
                                           uint64_t seed) const;

  // Writes landing on each destination rank, and in total, when `num_pages` pages of a
  // request are sent for every layer. Derived from the same routes as AppendLayerWrites.
  std::vector<uint64_t> ExpectedWritesPerRank(size_t num_pages, uint64_t seed) const;
  uint64_t ExpectedWrites(size_t num_pages, uint64_t seed) const;
  // Bytes those writes move (the sum of their lengths).
  uint64_t ExpectedBytes(size_t num_pages, uint64_t seed) const;

  const KvSideLayout& source() const { return source_; }
  const KvSideLayout& destination() const { return destination_; }
  int num_layers() const { return source_.ranks[0].num_layers; }

 private:
  // Heads [src_head, src_head + num_heads) of src_rank's cache are heads
  // [dst_head, dst_head + num_heads) of dst_rank's (rank-local head indices).
  struct Route {
    int src_rank = 0;
    int dst_rank = 0;
    int src_head = 0;
    int dst_head = 0;
    int num_heads = 0;
    bool whole_blocks = false;  // both ranks hold exactly these heads: one write per page
    // What AppendLayerWrites emits per page and ExpectedWritesPerRank counts, for a layout of
    // `components` components: one whole block, or one write per component.
    int writes_per_page(int components) const { return whole_blocks ? 1 : components; }
  };

  TransferPlan(KvSideLayout source, KvSideLayout destination);
  std::vector<Route> Routes(uint64_t seed) const;
  Status CheckPages(std::span<const PagePair> pages, int layer) const;

  KvSideLayout source_;
  KvSideLayout destination_;
  PageId source_pages_ = 0;       // smallest num_pages over the source ranks
  PageId destination_pages_ = 0;  // same for the destination
};

}  // namespace pdserve
