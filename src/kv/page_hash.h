// PageHash and PrefixHasher: the identity of a full page of KV for prefix caching. A page's
// hash chains its predecessor's hash with its own tokens, so it names the whole prefix up to
// the page's end; the first page's predecessor is a seed over everything else its KV depends
// on (the caller's salt: the model's fingerprint and the KV dtype; the page size; the
// lookahead). Two pages with the same hash hold the same KV, bit for bit, as long as the
// kernels are batch-invariant. The hash is the first 128 bits of SHA-256 over (parent hash, the
// page's tokens as little-endian u32), so it is the same on every host and may cross processes.
//
// Lookahead: where a page's KV also depends on tokens after it — with DeepSeek's MTP KV layer
// the module's entry of a position is computed from the next token too, so a page's last slot
// depends on the first token of the next page — a page's identity covers `lookahead` tokens
// past its end: page i hashes tokens [i * page, (i + 1) * page + lookahead), and a page has a
// hash only once those tokens are known. The lookahead is in the seed too, so hashes of the
// two kinds never meet; without one (0) hashes are those of a hasher that has none.
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
  // engine puts in). Preconditions: page_tokens >= 1, lookahead >= 0.
  PrefixHasher(std::string_view salt, int page_tokens, int lookahead = 0);

  // The parent of a sequence's first page.
  const PageHash& seed() const { return seed_; }
  int page_tokens() const { return page_tokens_; }
  int lookahead() const { return lookahead_; }
  // Tokens a page's identity covers: its own and the lookahead.
  int identity_tokens() const { return page_tokens_ + lookahead_; }
  // The tokens page i's identity covers: tokens[i * page_tokens, + identity_tokens()).
  // Precondition: tokens holds them.
  std::span<const int32_t> IdentityOf(std::span<const int32_t> tokens, size_t page) const;
  // The hash of a page whose identity is `page` (identity_tokens() tokens: its own, then the
  // lookahead) after the prefix `parent` names.
  PageHash Chain(const PageHash& parent, std::span<const int32_t> page) const;
  // How many leading pages of `tokens` have a hash: full pages whose lookahead is known too.
  size_t HashablePages(size_t tokens) const;
  // Appends to *hashes the hashes of `tokens`' hashable pages past the first hashes->size()
  // ones, until it holds `pages` (or every hashable page of `tokens`).
  void Extend(std::span<const int32_t> tokens, size_t pages, std::vector<PageHash>* hashes) const;

 private:
  PageHash seed_;
  int page_tokens_;
  int lookahead_;
};

}  // namespace pdserve
