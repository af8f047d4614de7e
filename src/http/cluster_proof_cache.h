// ClusterProofReplayCache: the cluster proofs (http/cluster_auth.h) a process has accepted and
// that are not yet stale, so that each is accepted once: a copy seen on the wire and sent again
// is refused. Entries are kept only while their proof could still pass the time check, so
// memory follows the rate of internal requests over one window; at `capacity` live entries new
// proofs are refused (failing closed) until old ones expire. Only proofs that verified are
// added, so a client without the secret cannot fill it. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <queue>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "http/cluster_auth.h"

namespace pdserve::http {

class ClusterProofReplayCache {
 public:
  explicit ClusterProofReplayCache(size_t capacity = size_t{1} << 16) : capacity_(capacity) {}

  // True, and `stamp` remembered until it expires, if no live entry has its nonce; false for
  // a replay, or when the cache is full. Entries that expired before `now` go first.
  bool Admit(const ClusterProofStamp& stamp, int64_t now = UnixNow()) EXCLUDES(mu_);
  // Live entries (for tests).
  size_t size() const EXCLUDES(mu_);

 private:
  void ForgetExpired(int64_t now) REQUIRES(mu_);

  const size_t capacity_;
  mutable Mutex mu_;
  std::unordered_set<std::string> nonces_ GUARDED_BY(mu_);
  // (expires, nonce), the soonest to expire on top.
  std::priority_queue<std::pair<int64_t, std::string>, std::vector<std::pair<int64_t, std::string>>,
                      std::greater<>>
      expiries_ GUARDED_BY(mu_);
};

}  // namespace pdserve::http
