// ServerMetrics: the node's Prometheus metrics (names as vLLM/SGLang users know them, prefixed
// "pdserve:") and their text exposition. Thread-safe: HTTP threads record, /metrics renders.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/histogram.h"
#include "common/mutex.h"
#include "engine/engine.h"

namespace pdserve::server {

class ServerMetrics {
 public:
  ServerMetrics();
  void ObserveTimeToFirstToken(double seconds) EXCLUDES(mu_);
  void ObserveInterTokenLatency(double seconds) EXCLUDES(mu_);
  void ObserveE2eLatency(double seconds) EXCLUDES(mu_);
  void AddPromptTokens(int64_t n) EXCLUDES(mu_);
  void AddGenerationTokens(int64_t n) EXCLUDES(mu_);
  void RequestSucceeded(const std::string& finish_reason) EXCLUDES(mu_);
  void RequestFailed(int http_status) EXCLUDES(mu_);
  // The whole exposition; gauges come from the engine's latest stats.
  std::string Render(const EngineStats& stats) const EXCLUDES(mu_);

 private:
  mutable Mutex mu_;
  Histogram ttft_ GUARDED_BY(mu_);
  Histogram itl_ GUARDED_BY(mu_);
  Histogram e2e_ GUARDED_BY(mu_);
  int64_t prompt_tokens_ GUARDED_BY(mu_) = 0;
  int64_t generation_tokens_ GUARDED_BY(mu_) = 0;
  std::map<std::string, int64_t> success_ GUARDED_BY(mu_);  // by finish reason
  std::map<int, int64_t> errors_ GUARDED_BY(mu_);           // by HTTP status
};

}  // namespace pdserve::server
