// PrefixIndex: an approximate record of which prompt prefixes each target (a node, a prefill
// peer) has seen, for routing by prefix. A prompt is cut into blocks and named by chained
// hashes (block i's hash covers blocks 0..i), so "target T holds the first k blocks" is "T's
// set holds hash k-1" — checked block by block from the first. The index learns only from the
// choices its owner made (Record after routing); it never hears of evictions, so each target
// keeps its most recently used `capacity` hashes (LRU) as a stand-in for the cache's size. This
// is the "approximate" scheme of llm-d's prefix-cache scorer and SGLang's cache-aware router:
// no events from the nodes, and a wrong guess costs only a cache miss, never a wrong answer.
// Thread-safe: every method may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"

namespace pdserve {

// Chained 64-bit block hashes of `bytes` cut into blocks of `block_bytes` (the last, partial
// block left out): hash_i = first 8 bytes of SHA-256(hash_{i-1} || block_i), hash_{-1} = 0.
std::vector<uint64_t> ChainBlockHashes(std::string_view bytes, size_t block_bytes);

class PrefixIndex {
 public:
  // Each target keeps at most `capacity` hashes (at least 1).
  explicit PrefixIndex(size_t capacity);
  PrefixIndex(const PrefixIndex&) = delete;
  PrefixIndex& operator=(const PrefixIndex&) = delete;

  // The target now holds these blocks (most recently used); it keeps at most `capacity` hashes
  // (0: the index's).
  void Record(const std::string& target, std::span<const uint64_t> chain, size_t capacity = 0)
      EXCLUDES(mu_);
  // How many leading blocks of `chain` the target is thought to hold.
  size_t Match(const std::string& target, std::span<const uint64_t> chain) const EXCLUDES(mu_);
  // The target lost its cache (restarted, removed).
  void Forget(const std::string& target) EXCLUDES(mu_);

 private:
  struct Target {
    std::list<uint64_t> lru;  // most recent first
    std::unordered_map<uint64_t, std::list<uint64_t>::iterator> where;
  };

  const size_t capacity_;
  mutable Mutex mu_;
  std::unordered_map<std::string, Target> targets_ GUARDED_BY(mu_);
};

}  // namespace pdserve
