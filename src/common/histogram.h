// Histogram: a cumulative histogram with fixed upper bounds and its Prometheus text exposition
// (_bucket/_sum/_count). Used by the node's /metrics and the KV messenger's transfer latency.
// Thread-compatible: callers lock.
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
  // Appends "# HELP", "# TYPE" and the _bucket/_sum/_count lines.
  void Render(const std::string& name, const std::string& help, std::string* out) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bound, not cumulative; one more for +Inf
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

}  // namespace pdserve
