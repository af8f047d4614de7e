#include "http/cluster_proof_cache.h"

namespace pdserve::http {

bool ClusterProofReplayCache::Admit(const ClusterProofStamp& stamp, int64_t now) {
  MutexLock lock(&mu_);
  ForgetExpired(now);
  if (nonces_.size() >= capacity_ || nonces_.contains(stamp.nonce)) return false;
  nonces_.insert(stamp.nonce);
  expiries_.emplace(stamp.expires, stamp.nonce);
  return true;
}

size_t ClusterProofReplayCache::size() const {
  MutexLock lock(&mu_);
  return nonces_.size();
}

void ClusterProofReplayCache::ForgetExpired(int64_t now) {
  while (!expiries_.empty() && expiries_.top().first < now) {
    nonces_.erase(expiries_.top().second);
    expiries_.pop();
  }
}

}  // namespace pdserve::http
