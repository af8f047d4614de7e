#include "bench/serve_metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <utility>

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

CacheCounters ParseCacheCounters(std::string_view metrics_text) {
  CacheCounters c;
  const std::pair<std::string_view, std::optional<double>*> names[] = {
      {"vllm:prefix_cache_queries_total", &c.queries},
      {"vllm:prefix_cache_hits_total", &c.hits},
      {"pdserve:messenger_kv_bytes_sent_total", &c.kv_bytes_sent},
      {"pdserve:messenger_kv_bytes_received_total", &c.kv_bytes_received},
      {"pdserve:messenger_kv_pages_not_transferred_total", &c.kv_pages_not_transferred},
      {"pdserve:messenger_kv_bytes_not_transferred_total", &c.kv_bytes_not_transferred},
  };
  ForEachPromSample(metrics_text, [&](std::string_view name, std::string_view, double value) {
    for (const auto& [wanted, field] : names) {
      if (name == wanted) *field = field->value_or(0.0) + value;
    }
  });
  return c;
}

double CacheUsage::hit_rate() const {
  if (!queries || !hits || *queries <= 0) return std::numeric_limits<double>::quiet_NaN();
  return static_cast<double>(*hits) / static_cast<double>(*queries);
}

CacheUsage CacheUsageBetween(const CacheCounters& before, const CacheCounters& after) {
  auto delta = [](const std::optional<double>& b,
                  const std::optional<double>& a) -> std::optional<int64_t> {
    if (!a || !b) return std::nullopt;
    return static_cast<int64_t>(std::llround(*a - *b));
  };
  CacheUsage u;
  u.queries = delta(before.queries, after.queries);
  u.hits = delta(before.hits, after.hits);
  u.kv_bytes_sent = delta(before.kv_bytes_sent, after.kv_bytes_sent);
  u.kv_bytes_received = delta(before.kv_bytes_received, after.kv_bytes_received);
  u.kv_pages_not_transferred =
      delta(before.kv_pages_not_transferred, after.kv_pages_not_transferred);
  u.kv_bytes_not_transferred =
      delta(before.kv_bytes_not_transferred, after.kv_bytes_not_transferred);
  return u;
}

CacheUsage SumCacheUsage(const std::vector<CacheUsage>& nodes) {
  CacheUsage sum;
  auto add = [](std::optional<int64_t>& to, const std::optional<int64_t>& more) {
    if (more) to = to.value_or(0) + *more;
  };
  for (const CacheUsage& n : nodes) {
    add(sum.queries, n.queries);
    add(sum.hits, n.hits);
    add(sum.kv_bytes_sent, n.kv_bytes_sent);
    add(sum.kv_bytes_received, n.kv_bytes_received);
    add(sum.kv_pages_not_transferred, n.kv_pages_not_transferred);
    add(sum.kv_bytes_not_transferred, n.kv_bytes_not_transferred);
  }
  return sum;
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
  // Multi-turn: TTFT of each turn, and of turns 2..T together.
  int num_turns = 0;
  for (const RequestOutcome& o : outcomes) num_turns = std::max(num_turns, o.turn);
  auto turn_ttft = [&](int turn, bool later) {
    TurnTtft t;
    t.turn = turn;
    std::vector<double> turn_ttfts;
    double prompt_sum = 0;
    for (const RequestOutcome& o : outcomes) {
      if (!o.success || (later ? o.turn < 2 : o.turn != turn)) continue;
      turn_ttfts.push_back(o.ttft_s);
      prompt_sum += o.prompt_len;
    }
    t.completed = static_cast<int>(turn_ttfts.size());
    t.mean_prompt_len = t.completed > 0 ? prompt_sum / t.completed : 0;
    t.ttft = Summarize(turn_ttfts, percentiles);
    return t;
  };
  for (int turn = 1; turn <= num_turns; ++turn) {
    m.ttft_by_turn.push_back(turn_ttft(turn, /*later=*/false));
  }
  if (num_turns > 1) m.ttft_later_turns = turn_ttft(0, /*later=*/true);
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
  if (m.cache) {
    auto cache_json = [](const CacheUsage& u) {
      nlohmann::json c;
      const std::pair<const char*, const std::optional<int64_t>*> fields[] = {
          {"prefix_cache_queries", &u.queries},
          {"prefix_cache_hits", &u.hits},
          {"kv_bytes_sent", &u.kv_bytes_sent},
          {"kv_bytes_received", &u.kv_bytes_received},
          {"kv_pages_not_transferred", &u.kv_pages_not_transferred},
          {"kv_bytes_not_transferred", &u.kv_bytes_not_transferred},
      };
      for (const auto& [name, value] : fields) {
        if (*value) c[name] = **value;
      }
      if (u.queries) c["prefix_cache_hit_rate"] = NullIfNan(100 * u.hit_rate());
      return c;
    };
    j.update(cache_json(*m.cache));
    nlohmann::json by_server = nlohmann::json::array();
    for (const CacheUsage& u : m.cache_by_server) {
      nlohmann::json c = cache_json(u);
      c["server"] = u.server;
      by_server.push_back(std::move(c));
    }
    j["cache_by_server"] = std::move(by_server);
  }
  if (!m.ttft_by_turn.empty()) {
    nlohmann::json conversations = nlohmann::json::array(), turns = nlohmann::json::array();
    for (const RequestOutcome& o : outcomes) {
      conversations.push_back(o.conversation);
      turns.push_back(o.turn);
    }
    j["conversations"] = std::move(conversations);
    j["turns"] = std::move(turns);
    auto turn_json = [](const TurnTtft& t) {
      nlohmann::json tj = {{"completed", t.completed},
                           {"mean_input_len", t.mean_prompt_len},
                           {"mean_ttft_ms", t.ttft.mean_ms},
                           {"median_ttft_ms", t.ttft.median_ms},
                           {"std_ttft_ms", t.ttft.std_ms}};
      for (const auto& [p, value] : t.ttft.percentiles_ms) {
        tj["p" + PercentileWord(p) + "_ttft_ms"] = value;
      }
      return tj;
    };
    nlohmann::json by_turn = nlohmann::json::array();
    for (const TurnTtft& t : m.ttft_by_turn) {
      nlohmann::json tj = turn_json(t);
      tj["turn"] = t.turn;
      by_turn.push_back(std::move(tj));
    }
    j["ttft_by_turn"] = std::move(by_turn);
    if (m.ttft_later_turns) j["later_turns"] = turn_json(*m.ttft_later_turns);
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
  if (!m.ttft_by_turn.empty()) {
    out += Centered("Time to First Token by Turn", '-');
    auto turn_row = [&](const std::string& name, const TurnTtft& t) {
      row(fmt::format("{} mean / median TTFT (ms):", name),
          fmt::format("{} / {} (n={}, {:.0f} tokens)", num(t.ttft.mean_ms), num(t.ttft.median_ms),
                      t.completed, t.mean_prompt_len));
    };
    for (const TurnTtft& t : m.ttft_by_turn) turn_row(fmt::format("Turn {}", t.turn), t);
    if (m.ttft_later_turns) {
      turn_row(fmt::format("Turns 2-{}", m.ttft_by_turn.size()), *m.ttft_later_turns);
    }
  }
  if (m.cache) {
    const CacheUsage& c = *m.cache;
    out += Centered("Prefix Caching and KV Transfer", '-');
    if (c.queries) {
      const double rate = c.hit_rate();
      row("Prefix cache hit rate (%):",
          std::isnan(rate) ? std::string("n/a") : fmt::format("{:.2f}", 100 * rate));
      row("Prefix cache queries (tokens):", std::to_string(*c.queries));
      row("Prefix cache hits (tokens):", std::to_string(c.hits.value_or(0)));
    }
    if (c.kv_bytes_sent) row("KV bytes sent (prefill nodes):", std::to_string(*c.kv_bytes_sent));
    if (c.kv_bytes_received) {
      row("KV bytes received (decode nodes):", std::to_string(*c.kv_bytes_received));
    }
    if (c.kv_bytes_not_transferred) {
      row("KV bytes not transferred (D's hits):", std::to_string(*c.kv_bytes_not_transferred));
    }
  }
  out += std::string(50, '=') + "\n";
  return out;
}

}  // namespace pdserve::bench
