#include "bench/serve_metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
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

constexpr std::string_view kSpecDrafts = "vllm:spec_decode_num_drafts_total";
constexpr std::string_view kSpecDraftTokens = "vllm:spec_decode_num_draft_tokens_total";
constexpr std::string_view kSpecAccepted = "vllm:spec_decode_num_accepted_tokens_total";
constexpr std::string_view kSpecPerPosition = "vllm:spec_decode_num_accepted_tokens_per_pos_total";

// The value of label `key` in a sample's label text (between the braces), or nullopt.
std::optional<std::string> SpecLabelValue(std::string_view labels, std::string_view key) {
  size_t pos = 0;
  while (pos < labels.size()) {
    while (pos < labels.size() && (labels[pos] == ',' || labels[pos] == ' ')) ++pos;
    const size_t eq = labels.find('=', pos);
    if (eq == std::string_view::npos || eq + 1 >= labels.size() || labels[eq + 1] != '"') break;
    const std::string_view name = labels.substr(pos, eq - pos);
    std::string value;
    size_t i = eq + 2;
    for (; i < labels.size() && labels[i] != '"'; ++i) {
      if (labels[i] == '\\' && i + 1 < labels.size()) ++i;  // an escaped character
      value += labels[i];
    }
    if (name == key) return value;
    pos = i + 1;
  }
  return std::nullopt;
}

// Calls fn(name, label text, value) for every sample line of Prometheus text.
template <typename Fn>
void ForEachPromSample(std::string_view text, Fn fn) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    const std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    if (line.empty() || line.front() == '#') continue;
    const size_t name_end = line.find_first_of("{ ");
    if (name_end == std::string_view::npos) continue;
    std::string_view labels;
    size_t value_at = name_end;
    if (line[name_end] == '{') {
      const size_t close = line.rfind('}');
      if (close == std::string_view::npos) continue;
      labels = line.substr(name_end + 1, close - name_end - 1);
      value_at = close + 1;
    }
    const std::string value_text(line.substr(value_at));
    char* end = nullptr;
    const double value = std::strtod(value_text.c_str(), &end);
    if (end == value_text.c_str() || !std::isfinite(value)) continue;
    fn(line.substr(0, name_end), labels, value);
  }
}

double SpecRatio(double num, double den) {
  return den > 0 ? num / den : std::numeric_limits<double>::quiet_NaN();
}

nlohmann::json NullIfNan(double v) {
  return std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v);
}

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

std::optional<double> SumOfSamples(std::string_view metrics_text, std::string_view name) {
  std::optional<double> sum;
  ForEachPromSample(metrics_text, [&](std::string_view n, std::string_view, double value) {
    if (n == name) sum = sum.value_or(0.0) + value;
  });
  return sum;
}

std::optional<SpecDecodeCounters> ParseSpecDecodeCounters(std::string_view metrics_text) {
  SpecDecodeCounters c;
  bool seen = false;
  ForEachPromSample(
      metrics_text, [&](std::string_view name, std::string_view labels, double value) {
        if (name == kSpecDrafts) {
          c.drafts += value;
        } else if (name == kSpecDraftTokens) {
          c.draft_tokens += value;
        } else if (name == kSpecAccepted) {
          c.accepted_tokens += value;
        } else if (name == kSpecPerPosition) {
          const std::optional<std::string> position = SpecLabelValue(labels, "position");
          const int k = position ? std::atoi(position->c_str()) : -1;
          if (k < 0 || k > 4096) return;
          if (c.accepted_per_position.size() <= static_cast<size_t>(k)) {
            c.accepted_per_position.resize(static_cast<size_t>(k) + 1, 0.0);
          }
          c.accepted_per_position[static_cast<size_t>(k)] += value;
        } else {
          return;
        }
        seen = true;
      });
  if (!seen) return std::nullopt;
  return c;
}

void AddSpecDecodeCounters(SpecDecodeCounters& sum, const SpecDecodeCounters& more) {
  sum.drafts += more.drafts;
  sum.draft_tokens += more.draft_tokens;
  sum.accepted_tokens += more.accepted_tokens;
  if (sum.accepted_per_position.size() < more.accepted_per_position.size()) {
    sum.accepted_per_position.resize(more.accepted_per_position.size(), 0.0);
  }
  for (size_t k = 0; k < more.accepted_per_position.size(); ++k) {
    sum.accepted_per_position[k] += more.accepted_per_position[k];
  }
}

SpecDecodeAcceptance SpecAcceptanceBetween(const SpecDecodeCounters& before,
                                           const SpecDecodeCounters& after) {
  auto delta = [](double a, double b) { return static_cast<int64_t>(std::llround(a - b)); };
  SpecDecodeAcceptance s;
  s.drafts = delta(after.drafts, before.drafts);
  s.draft_tokens = delta(after.draft_tokens, before.draft_tokens);
  s.accepted_tokens = delta(after.accepted_tokens, before.accepted_tokens);
  const size_t k =
      std::max(before.accepted_per_position.size(), after.accepted_per_position.size());
  for (size_t i = 0; i < k; ++i) {
    const double a = i < after.accepted_per_position.size() ? after.accepted_per_position[i] : 0;
    const double b = i < before.accepted_per_position.size() ? before.accepted_per_position[i] : 0;
    s.accepted_per_position.push_back(delta(a, b));
    s.per_position_rates.push_back(
        SpecRatio(static_cast<double>(s.accepted_per_position.back()), s.drafts));
  }
  s.acceptance_rate = SpecRatio(static_cast<double>(s.accepted_tokens), s.draft_tokens);
  s.acceptance_length = 1 + SpecRatio(static_cast<double>(s.accepted_tokens), s.drafts);
  return s;
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
  if (m.spec) {
    const SpecDecodeAcceptance& sd = *m.spec;
    j["spec_decode_num_drafts"] = sd.drafts;
    j["spec_decode_draft_tokens"] = sd.draft_tokens;
    j["spec_decode_accepted_tokens"] = sd.accepted_tokens;
    j["spec_decode_acceptance_rate"] = NullIfNan(100 * sd.acceptance_rate);
    j["spec_decode_acceptance_length"] = NullIfNan(sd.acceptance_length);
    nlohmann::json rates = nlohmann::json::array();
    for (double r : sd.per_position_rates) rates.push_back(NullIfNan(r));
    j["spec_decode_per_position_acceptance_rates"] = std::move(rates);
  }
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
  if (m.spec) {
    const SpecDecodeAcceptance& sd = *m.spec;
    auto ratio = [](double v, double scale) {
      return std::isnan(v) ? std::string("n/a") : fmt::format("{:.2f}", v * scale);
    };
    out += Centered("Speculative Decoding", '-');
    row("Acceptance rate (%):", ratio(sd.acceptance_rate, 100));
    row("Acceptance length:", ratio(sd.acceptance_length, 1));
    row("Drafts:", std::to_string(sd.drafts));
    row("Draft tokens:", std::to_string(sd.draft_tokens));
    row("Accepted tokens:", std::to_string(sd.accepted_tokens));
    std::string per_position;
    for (double r : sd.per_position_rates) {
      per_position += (per_position.empty() ? "" : ", ") + ratio(r, 100);
    }
    row("Per-position acceptance (%):", per_position);
  }
  out += std::string(50, '=') + "\n";
  return out;
}

}  // namespace pdserve::bench
