// Histogram: a histogram with fixed upper bounds (written out by common/metrics_text.h as
// Prometheus's cumulative _bucket/_sum/_count). Used by the node's /metrics and the KV
// messenger's transfer latency. Thread-compatible: callers lock.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pdserve {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);
  uint64_t count() const { return count_; }
  double sum() const { return sum_; }
  const std::vector<double>& bounds() const { return bounds_; }
  // Observations per bound (not cumulative), then one more for those above the last bound.
  const std::vector<uint64_t>& bucket_counts() const { return counts_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bound, not cumulative; one more for +Inf
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

}  // namespace pdserve
