#include "bench/serve_metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>

#include <fmt/format.h>

namespace pdserve::bench {

const char* FailureKindName(FailureKind kind) {
  switch (kind) {
    case FailureKind::kNone:
      return "none";
    case FailureKind::kConnect:
      return "connect";
    case FailureKind::kHttpError:
      return "http_error";
    case FailureKind::kHttpErrorMalformed:
      return "http_error_malformed";
    case FailureKind::kErrorEvent:
      return "error_event";
    case FailureKind::kTimeout:
      return "timeout";
    case FailureKind::kBroken:
      return "broken";
    case FailureKind::kNoDone:
      return "no_done";
    case FailureKind::kNoContent:
      return "no_content";
    case FailureKind::kMalformedChunk:
      return "malformed_chunk";
  }
  return "unknown";
}
namespace {

LatencyStats Summarize(const std::vector<double>& seconds, const std::vector<double>& percentiles) {
  LatencyStats s;
  s.mean_ms = Mean(seconds) * 1000;
  s.median_ms = Median(seconds) * 1000;
  s.std_ms = PopulationStd(seconds) * 1000;
  for (double p : percentiles) s.percentiles_ms.emplace_back(p, Percentile(seconds, p) * 1000);
  return s;
}

// "99" for 99, "99.9" for 99.9: the suffix vllm gives its pNN_* fields.
std::string PercentileWord(double p) {
  if (p == std::floor(p)) return fmt::format("{}", static_cast<long long>(p));
  return fmt::format("{}", p);
}

const LatencyStats* StatsOf(const ServeMetrics& m, const std::string& name) {
  if (name == "ttft") return &m.ttft;
  if (name == "tpot") return &m.tpot;
  if (name == "itl") return &m.itl;
  if (name == "e2el") return &m.e2el;
  return nullptr;
}

struct MetricTitle {
  const char* name;
  const char* label;
  const char* header;
};
constexpr MetricTitle kTitles[] = {
    {"ttft", "TTFT", "Time to First Token"},
    {"tpot", "TPOT", "Time per Output Token (excl. 1st token)"},
    {"itl", "ITL", "Inter-token Latency"},
    {"e2el", "E2EL", "End-to-end Latency"},
};

std::string Centered(const std::string& text, char fill) {
  const int width = 50;
  const int pad = std::max(0, width - static_cast<int>(text.size()));
  return std::string(pad / 2, fill) + text + std::string(pad - pad / 2, fill) + "\n";
}

}  // namespace

Result<GoodputSlo> ParseGoodput(const std::vector<std::string>& pairs) {
  GoodputSlo slo;
  for (const std::string& pair : pairs) {
    const size_t colon = pair.find(':');
    const std::string name = pair.substr(0, colon);
    char* end = nullptr;
    const double ms = colon == std::string::npos ? -1 : std::strtod(pair.c_str() + colon + 1, &end);
    if (colon == std::string::npos || end == pair.c_str() + colon + 1 || *end != '\0' ||
        !(ms >= 0) || !std::isfinite(ms)) {
      return Status::InvalidArgument(
          fmt::format("--goodput '{}': expected NAME:MS with MS a non-negative number", pair));
    }
    if (name == "ttft") {
      slo.ttft_ms = ms;
    } else if (name == "tpot") {
      slo.tpot_ms = ms;
    } else if (name == "e2el") {
      slo.e2el_ms = ms;
    } else if (name == "itl") {
      slo.itl_ms = ms;
    } else {
      return Status::InvalidArgument(
          fmt::format("--goodput '{}': the metric must be ttft, tpot, itl or e2el", pair));
    }
  }
  return slo;
}

double Mean(const std::vector<double>& v) {
  if (v.empty()) return 0;
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

double Median(const std::vector<double>& v) { return Percentile(v, 50); }

double PopulationStd(const std::vector<double>& v) {
  if (v.empty()) return 0;
  const double mean = Mean(v);
  double sum = 0;
  for (double x : v) sum += (x - mean) * (x - mean);
  return std::sqrt(sum / static_cast<double>(v.size()));
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - static_cast<double>(lo));
}

ServeMetrics ComputeServeMetrics(const std::vector<RequestOutcome>& outcomes, double duration_s,
                                 const std::vector<double>& percentiles, const GoodputSlo& slo) {
  ServeMetrics m;
  m.duration_s = duration_s;
  std::vector<double> ttfts, tpots, itls, e2els;
  int good = 0;
  for (const RequestOutcome& o : outcomes) {
    if (!o.success) {
      ++m.failed;
      continue;
    }
    ++m.completed;
    m.total_input += o.prompt_len;
    m.total_output += o.output_tokens;
    // A one-token answer has no TPOT; it counts as 0 against a TPOT SLO (as in vllm).
    double tpot = 0;
    if (o.output_tokens > 1) {
      tpot = (o.e2el_s - o.ttft_s) / (o.output_tokens - 1);
      tpots.push_back(tpot);
    }
    ttfts.push_back(o.ttft_s);
    e2els.push_back(o.e2el_s);
    itls.insert(itls.end(), o.itls_s.begin(), o.itls_s.end());
    const double max_itl =
        o.itls_s.empty() ? 0 : *std::max_element(o.itls_s.begin(), o.itls_s.end());
    if (slo.any() && (!slo.ttft_ms || o.ttft_s * 1000 <= *slo.ttft_ms) &&
        (!slo.tpot_ms || tpot * 1000 <= *slo.tpot_ms) &&
        (!slo.itl_ms || max_itl * 1000 <= *slo.itl_ms) &&
        (!slo.e2el_ms || o.e2el_s * 1000 <= *slo.e2el_ms)) {
      ++good;
    }
  }
  if (duration_s > 0) {
    m.request_throughput = m.completed / duration_s;
    m.request_goodput = good / duration_s;
    m.output_throughput = static_cast<double>(m.total_output) / duration_s;
    m.total_token_throughput = static_cast<double>(m.total_input + m.total_output) / duration_s;
  }
  m.ttft = Summarize(ttfts, percentiles);
  m.tpot = Summarize(tpots, percentiles);
  m.itl = Summarize(itls, percentiles);
  m.e2el = Summarize(e2els, percentiles);
  return m;
}

nlohmann::json MetricsToJson(const ServeMetrics& m, const std::vector<RequestOutcome>& outcomes,
                             const std::vector<std::string>& percentile_metrics, bool has_slo) {
  nlohmann::json j;
  j["duration"] = m.duration_s;
  j["completed"] = m.completed;
  j["failed"] = m.failed;
  j["total_input_tokens"] = m.total_input;
  j["total_output_tokens"] = m.total_output;
  j["request_throughput"] = m.request_throughput;
  j["request_goodput"] = has_slo ? nlohmann::json(m.request_goodput) : nlohmann::json(nullptr);
  j["output_throughput"] = m.output_throughput;
  j["total_token_throughput"] = m.total_token_throughput;
  // Per-request lists in request order; a failed request has output_len 0, ttft 0, no itls
  // and its error (vllm's shapes).
  nlohmann::json input_lens = nlohmann::json::array(), output_lens = nlohmann::json::array(),
                 ttfts = nlohmann::json::array(), itls = nlohmann::json::array(),
                 errors = nlohmann::json::array();
  for (const RequestOutcome& o : outcomes) {
    input_lens.push_back(o.prompt_len);
    output_lens.push_back(o.success ? o.output_tokens : 0);
    ttfts.push_back(o.success ? o.ttft_s : 0.0);
    itls.push_back(o.success ? o.itls_s : std::vector<double>{});
    errors.push_back(o.error);
  }
  j["input_lens"] = std::move(input_lens);
  j["output_lens"] = std::move(output_lens);
  j["ttfts"] = std::move(ttfts);
  j["itls"] = std::move(itls);
  j["errors"] = std::move(errors);
  for (const std::string& name : percentile_metrics) {
    const LatencyStats* s = StatsOf(m, name);
    if (s == nullptr) continue;
    j["mean_" + name + "_ms"] = s->mean_ms;
    j["median_" + name + "_ms"] = s->median_ms;
    j["std_" + name + "_ms"] = s->std_ms;
    for (const auto& [p, value] : s->percentiles_ms) {
      j["p" + PercentileWord(p) + "_" + name + "_ms"] = value;
    }
  }
  return j;
}

std::string FormatMetricsTable(const ServeMetrics& m,
                               const std::vector<std::string>& percentile_metrics, bool has_slo) {
  std::string out = Centered(" Serving Benchmark Result ", '=');
  auto row = [&out](const std::string& label, const std::string& value) {
    out += fmt::format("{:<40} {:<10}\n", label, value);
  };
  auto num = [](double v) { return fmt::format("{:.2f}", v); };
  row("Successful requests:", std::to_string(m.completed));
  row("Failed requests:", std::to_string(m.failed));
  row("Benchmark duration (s):", num(m.duration_s));
  row("Total input tokens:", std::to_string(m.total_input));
  row("Total generated tokens:", std::to_string(m.total_output));
  row("Request throughput (req/s):", num(m.request_throughput));
  if (has_slo) row("Request goodput (req/s):", num(m.request_goodput));
  row("Output token throughput (tok/s):", num(m.output_throughput));
  row("Total Token throughput (tok/s):", num(m.total_token_throughput));
  for (const MetricTitle& t : kTitles) {
    if (std::find(percentile_metrics.begin(), percentile_metrics.end(), t.name) ==
        percentile_metrics.end()) {
      continue;
    }
    const LatencyStats& s = *StatsOf(m, t.name);
    out += Centered(std::string(t.header), '-');
    row(fmt::format("Mean {} (ms):", t.label), num(s.mean_ms));
    row(fmt::format("Median {} (ms):", t.label), num(s.median_ms));
    row(fmt::format("Std {} (ms):", t.label), num(s.std_ms));
    for (const auto& [p, value] : s.percentiles_ms) {
      row(fmt::format("P{} {} (ms):", PercentileWord(p), t.label), num(value));
    }
  }
  out += std::string(50, '=') + "\n";
  return out;
}

}  // namespace pdserve::bench
