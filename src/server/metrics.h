// ServerMetrics: the node's Prometheus metrics (names as vLLM/SGLang users know them, prefixed
// "pdserve:") and their text exposition. Thread-safe: HTTP threads record, /metrics renders.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace pdserve::server {

// A cumulative histogram with fixed upper bounds. Thread-compatible (ServerMetrics locks).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);
  // Appends "# HELP", "# TYPE" and the _bucket/_sum/_count lines.
  void Render(const std::string& name, const std::string& help, std::string* out) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bound, not cumulative; one more for +Inf
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

class ServerMetrics {
 public:
  ServerMetrics();
  void ObserveTimeToFirstToken(double seconds);
  void ObserveInterTokenLatency(double seconds);
  void ObserveE2eLatency(double seconds);
  void AddPromptTokens(int64_t n);
  void AddGenerationTokens(int64_t n);
  void RequestSucceeded(const std::string& finish_reason);
  void RequestFailed(int http_status);
  // The whole exposition; gauges come from the engine's latest stats.
  std::string Render(const EngineStats& stats) const;

 private:
  mutable std::mutex mu_;
  Histogram ttft_;                          // guarded by mu_
  Histogram itl_;                           // guarded by mu_
  Histogram e2e_;                           // guarded by mu_
  int64_t prompt_tokens_ = 0;               // guarded by mu_
  int64_t generation_tokens_ = 0;           // guarded by mu_
  std::map<std::string, int64_t> success_;  // by finish reason; guarded by mu_
  std::map<int, int64_t> errors_;           // by HTTP status; guarded by mu_
};

}  // namespace pdserve::server
