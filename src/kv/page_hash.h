// PageHash and PrefixHasher: the identity of a full page of KV for prefix caching. A page's
// hash chains its predecessor's hash with its own tokens, so it names the whole prefix up to
// the page's end; the first page's predecessor is a seed over everything else its KV depends
// on (the caller's salt: the model's fingerprint and the KV dtype; and the page size). Two
// pages with the same hash hold the same KV, bit for bit, as long as the kernels are
// batch-invariant. The hash is the first 128 bits of SHA-256 over (parent hash, the page's
// tokens as little-endian u32), so it is the same on every host and may cross processes.
// Value types and a pure hasher: thread-compatible; a const PrefixHasher is safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace pdserve {

struct PageHash {
  uint64_t hi = 0;
  uint64_t lo = 0;
  friend bool operator==(const PageHash&, const PageHash&) = default;
};

// For unordered containers: the bits are already uniform.
struct PageHashHasher {
  size_t operator()(const PageHash& h) const { return static_cast<size_t>(h.lo); }
};

class PrefixHasher {
 public:
  // `salt`: what besides the tokens changes a page's KV (engine/prefix_cache.h says what the
  // engine puts in). Precondition: page_tokens >= 1.
  PrefixHasher(std::string_view salt, int page_tokens);

  // The parent of a sequence's first page.
  const PageHash& seed() const { return seed_; }
  int page_tokens() const { return page_tokens_; }
  // The hash of a page holding `page` (page_tokens() tokens) after the prefix `parent` names.
  PageHash Chain(const PageHash& parent, std::span<const int32_t> page) const;
  // Appends to *hashes the hashes of `tokens`' full pages past the first hashes->size() ones,
  // until it holds `pages` (or every full page of `tokens`).
  void Extend(std::span<const int32_t> tokens, size_t pages, std::vector<PageHash>* hashes) const;

 private:
  PageHash seed_;
  int page_tokens_;
};

}  // namespace pdserve
