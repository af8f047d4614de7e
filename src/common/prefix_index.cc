#include "common/prefix_index.h"

#include <algorithm>
#include <cstring>

#include "common/sha256.h"

namespace pdserve {

std::vector<uint64_t> ChainBlockHashes(std::string_view bytes, size_t block_bytes) {
  std::vector<uint64_t> chain;
  if (block_bytes == 0) return chain;
  chain.reserve(bytes.size() / block_bytes);
  uint64_t previous = 0;
  for (size_t at = 0; at + block_bytes <= bytes.size(); at += block_bytes) {
    Sha256 h;
    h.Update(std::string_view(reinterpret_cast<const char*>(&previous), sizeof(previous)));
    h.Update(bytes.substr(at, block_bytes));
    const Sha256Digest digest = h.Finish();
    std::memcpy(&previous, digest.data(), sizeof(previous));
    chain.push_back(previous);
  }
  return chain;
}

PrefixIndex::PrefixIndex(size_t capacity) : capacity_(std::max<size_t>(1, capacity)) {}

void PrefixIndex::Record(const std::string& target, std::span<const uint64_t> chain,
                         size_t capacity) {
  if (capacity == 0) capacity = capacity_;
  MutexLock lock(&mu_);
  Target& t = targets_[target];
  // Last block first, so a prompt's head ends up most recent: eviction takes tails before the
  // heads they hang from (a lost head would make its whole chain unmatched).
  for (auto c = chain.rbegin(); c != chain.rend(); ++c) {
    const uint64_t hash = *c;
    auto it = t.where.find(hash);
    if (it != t.where.end()) {
      t.lru.splice(t.lru.begin(), t.lru, it->second);
      continue;
    }
    t.lru.push_front(hash);
    t.where.emplace(hash, t.lru.begin());
  }
  // Only now: evicting while recording could drop this chain's own head before it is touched.
  while (t.lru.size() > capacity) {
    t.where.erase(t.lru.back());
    t.lru.pop_back();
  }
}

size_t PrefixIndex::Match(const std::string& target, std::span<const uint64_t> chain) const {
  MutexLock lock(&mu_);
  auto it = targets_.find(target);
  if (it == targets_.end()) return 0;
  size_t n = 0;
  while (n < chain.size() && it->second.where.count(chain[n]) != 0) ++n;
  return n;
}

void PrefixIndex::Forget(const std::string& target) {
  MutexLock lock(&mu_);
  targets_.erase(target);
}

}  // namespace pdserve
