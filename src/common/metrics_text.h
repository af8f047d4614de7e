// MetricsText: the one writer of Prometheus's text exposition format (0.0.4) — "# HELP" and
// "# TYPE" once per metric family, then its samples, label values escaped (\\, \", \n). Every
// /metrics of the project (node, messenger, router) is written through it, so a counter is
// always typed a counter. A plain value type; thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/histogram.h"

namespace pdserve {

enum class MetricType : uint8_t { kCounter, kGauge, kHistogram };

using MetricLabels = std::vector<std::pair<std::string_view, std::string_view>>;

class MetricsText {
 public:
  // A family of one unlabelled sample.
  MetricsText& Counter(std::string_view name, std::string_view help, double value);
  MetricsText& Gauge(std::string_view name, std::string_view help, double value);
  // A family whose samples follow (Sample with the same name).
  MetricsText& Family(std::string_view name, MetricType type, std::string_view help);
  MetricsText& Sample(std::string_view name, const MetricLabels& labels, double value);
  // A histogram family: its _bucket{le}, _sum and _count samples.
  MetricsText& Histogram(std::string_view name, std::string_view help, const pdserve::Histogram& h);
  // Text already in the format (another writer's output).
  MetricsText& Append(std::string_view text);

  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

}  // namespace pdserve
