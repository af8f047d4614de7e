#include "common/metrics_text.h"

#include <fmt/format.h>

namespace pdserve {
namespace {

const char* TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

void AppendEscaped(std::string_view value, std::string* out) {
  for (char c : value) {
    if (c == '\\' || c == '"') {
      out->push_back('\\');
      out->push_back(c);
    } else if (c == '\n') {
      *out += "\\n";
    } else {
      out->push_back(c);
    }
  }
}

}  // namespace

MetricsText& MetricsText::Family(std::string_view name, MetricType type, std::string_view help) {
  text_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, TypeName(type));
  return *this;
}

MetricsText& MetricsText::Sample(std::string_view name, const MetricLabels& labels, double value) {
  text_ += name;
  if (!labels.empty()) {
    text_ += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      if (i > 0) text_ += ',';
      text_ += labels[i].first;
      text_ += "=\"";
      AppendEscaped(labels[i].second, &text_);
      text_ += '"';
    }
    text_ += '}';
  }
  text_ += fmt::format(" {}\n", value);
  return *this;
}

MetricsText& MetricsText::Counter(std::string_view name, std::string_view help, double value) {
  return Family(name, MetricType::kCounter, help).Sample(name, {}, value);
}

MetricsText& MetricsText::Gauge(std::string_view name, std::string_view help, double value) {
  return Family(name, MetricType::kGauge, help).Sample(name, {}, value);
}

MetricsText& MetricsText::Histogram(std::string_view name, std::string_view help,
                                    const pdserve::Histogram& h) {
  Family(name, MetricType::kHistogram, help);
  const std::string bucket = std::string(name) + "_bucket";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < h.bounds().size(); ++i) {
    cumulative += h.bucket_counts()[i];
    Sample(bucket, {{"le", fmt::format("{}", h.bounds()[i])}}, static_cast<double>(cumulative));
  }
  cumulative += h.bucket_counts().back();
  Sample(bucket, {{"le", "+Inf"}}, static_cast<double>(cumulative));
  Sample(std::string(name) + "_sum", {}, h.sum());
  return Sample(std::string(name) + "_count", {}, static_cast<double>(h.count()));
}

MetricsText& MetricsText::Append(std::string_view text) {
  text_ += text;
  return *this;
}

}  // namespace pdserve
