// Metrics of `pdserve bench serve`, defined as `vllm bench serve` defines them:
// - TTFT: from sending the request to the first chunk that carries generated content.
// - ITL: every gap between two consecutive content chunks (a chunk may carry several tokens).
// - E2EL: from sending the request to the last content chunk.
// - TPOT: (E2EL - TTFT) / (output_tokens - 1), for requests with more than one output token.
// - Throughputs divide by the measured run duration; goodput counts the requests that meet
//   every SLO given (TPOT counts as 0 for requests of one token, as vllm does; the ITL SLO
//   bounds a request's largest gap).
// - Speculative decoding (when the served node speculates): the differences of its vLLM
//   counters (vllm:spec_decode_*) over the run, reported as vLLM reports them: acceptance rate
//   = accepted / drafted tokens, mean acceptance length = 1 + accepted / drafts (the token
//   verification adds counts), per-position acceptance = drafts whose token at that position
//   was accepted / drafts.
// - Prefix caching and KV transfer (when the served nodes expose them): the differences of
//   vLLM's vllm:prefix_cache_queries_total / _hits_total (tokens) and of pdserve's messenger
//   counters (bytes a prefill node sent, bytes a decode node received, and the pages and bytes
//   a decode node's own cache held so that no prefill node sent them), per node and summed.
// - Multi-turn datasets: TTFT per turn (every conversation's turn k together) and over the
//   later turns (2..T), whose history an earlier turn computed.
// Only successful requests enter latencies and token totals; failed ones are counted in
// `failed` with their error, never as fast ones. Statistics: mean, median, population std,
// percentiles with linear interpolation between ranks (numpy's default); 0 when no sample.
// Pure functions on plain values: safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace pdserve::bench {

// Why a request failed, for callers that judge failures (the soak, soak.h). Well-formed
// errors are kHttpError (an error status with an OpenAI-style JSON body {"error": {"message":
// ...}}) and kErrorEvent (an SSE event {"error": ...}); the others are broken answers.
enum class FailureKind : uint8_t {
  kNone,                // success
  kConnect,             // no HTTP answer at all (refused, reset before the status line)
  kHttpError,           // status other than 200 with a JSON error body
  kHttpErrorMalformed,  // status other than 200, body not an OpenAI-style error
  kErrorEvent,          // an error event in the stream
  kTimeout,             // --request-timeout passed
  kBroken,              // 200, then the connection broke mid-stream
  kNoDone,              // 200, the stream ended without data: [DONE] or an error event
  kNoContent,           // 200 and [DONE], but no generated text: a silent empty answer
  kMalformedChunk,      // a stream event that is not JSON
};
const char* FailureKindName(FailureKind kind);

// What one request produced, times in seconds from the moment it was sent.
struct RequestOutcome {
  bool success = false;
  FailureKind failure = FailureKind::kNone;
  std::string error;           // why it failed; empty on success
  int prompt_len = 0;          // input tokens (dataset count, else the server's usage)
  int output_tokens = 0;       // usage.completion_tokens, else the number of content chunks
  double ttft_s = 0;           // first content chunk
  double e2el_s = 0;           // last content chunk
  std::vector<double> itls_s;  // gaps between consecutive content chunks
  int conversation = -1;       // multi-turn: the request's conversation and turn (1-based)
  int turn = 0;
};

// Latency SLOs in milliseconds (`--goodput ttft:MS tpot:MS itl:MS e2el:MS`); unset ones are
// not checked. itl is pdserve's, not vllm's: a request meets it when every gap between its
// chunks does (TPOT averages a stall away; a streaming user sees it).
struct GoodputSlo {
  std::optional<double> ttft_ms, tpot_ms, itl_ms, e2el_ms;
  bool any() const { return ttft_ms || tpot_ms || itl_ms || e2el_ms; }
};

// Parses "ttft:MS" pairs; InvalidArgument names the bad pair.
Result<GoodputSlo> ParseGoodput(const std::vector<std::string>& pairs);

// Summary of one latency metric in milliseconds.
struct LatencyStats {
  double mean_ms = 0, median_ms = 0, std_ms = 0;
  std::vector<std::pair<double, double>> percentiles_ms;  // (percentile, value)
};

// The speculative-decoding counters of one or more nodes' /metrics (summed over nodes and over
// every label but the position).
struct SpecDecodeCounters {
  double drafts = 0;
  double draft_tokens = 0;
  double accepted_tokens = 0;
  std::vector<double> accepted_per_position;  // [k]
};

// The sum of every sample of `name` in Prometheus text, whatever its labels; nullopt when the
// text has none.
std::optional<double> SumOfSamples(std::string_view metrics_text, std::string_view name);

// Parses vllm:spec_decode_num_drafts_total, _num_draft_tokens_total, _num_accepted_tokens_total
// and _num_accepted_tokens_per_pos_total{position="k"} from Prometheus text; samples of the
// same name are summed whatever their labels (vLLM labels them by engine and model). nullopt
// when the text has none of them (the node does not speculate).
std::optional<SpecDecodeCounters> ParseSpecDecodeCounters(std::string_view metrics_text);

// Adds `more` (another node's counters) into `sum`.
void AddSpecDecodeCounters(SpecDecodeCounters& sum, const SpecDecodeCounters& more);

// Speculative decoding over a run: the counters' differences and vLLM's ratios of them.
struct SpecDecodeAcceptance {
  int64_t drafts = 0;
  int64_t draft_tokens = 0;
  int64_t accepted_tokens = 0;
  std::vector<int64_t> accepted_per_position;
  // NaN when no token (rate) or no draft (length, per position) was verified in the run.
  double acceptance_rate = 0;              // accepted / drafted tokens, in [0, 1]
  double acceptance_length = 0;            // 1 + accepted / drafts
  std::vector<double> per_position_rates;  // accepted_per_position[k] / drafts
};

// `after` - `before`, with the ratios. Positions missing from one side count 0 there.
SpecDecodeAcceptance SpecAcceptanceBetween(const SpecDecodeCounters& before,
                                           const SpecDecodeCounters& after);

// A node's prefix-cache and KV-transfer counters (Prometheus text; samples of one name summed
// whatever their labels); nullopt for those the node does not expose.
struct CacheCounters {
  std::optional<double> queries;            // vllm:prefix_cache_queries_total (tokens)
  std::optional<double> hits;               // vllm:prefix_cache_hits_total (tokens)
  std::optional<double> kv_bytes_sent;      // pdserve:messenger_kv_bytes_sent_total
  std::optional<double> kv_bytes_received;  // pdserve:messenger_kv_bytes_received_total
  std::optional<double>
      kv_pages_not_transferred;  // pdserve:messenger_kv_pages_not_transferred_total
  std::optional<double>
      kv_bytes_not_transferred;  // pdserve:messenger_kv_bytes_not_transferred_total
  bool any() const {
    return queries || hits || kv_bytes_sent || kv_bytes_received || kv_pages_not_transferred ||
           kv_bytes_not_transferred;
  }
};
CacheCounters ParseCacheCounters(std::string_view metrics_text);

// Those counters over a run (after - before; a counter either side lacks stays nullopt), for
// one node (`server` its URL) or summed over nodes (`server` empty; a counter is present when
// any node has it).
struct CacheUsage {
  std::string server;
  std::optional<int64_t> queries, hits;
  std::optional<int64_t> kv_bytes_sent, kv_bytes_received;
  std::optional<int64_t> kv_pages_not_transferred, kv_bytes_not_transferred;
  // hits / queries; NaN when no token was queried (or the node has no prefix-cache counters).
  double hit_rate() const;
};
CacheUsage CacheUsageBetween(const CacheCounters& before, const CacheCounters& after);
CacheUsage SumCacheUsage(const std::vector<CacheUsage>& nodes);

// TTFT of one turn of a multi-turn run (turn k of every conversation), or of its later turns
// (turn 0 here: turns 2..T together).
struct TurnTtft {
  int turn = 0;
  int completed = 0;
  double mean_prompt_len = 0;
  LatencyStats ttft;
};

struct ServeMetrics {
  int completed = 0;
  int failed = 0;
  long long total_input = 0;   // prompt tokens of completed requests
  long long total_output = 0;  // output tokens of completed requests
  double duration_s = 0;
  double request_throughput = 0;      // completed / duration
  double request_goodput = 0;         // requests meeting every SLO / duration
  double output_throughput = 0;       // total_output / duration
  double total_token_throughput = 0;  // (total_input + total_output) / duration
  LatencyStats ttft, tpot, itl, e2el;
  // Set by RunServeBench when the server's /metrics shows speculative decoding.
  std::optional<SpecDecodeAcceptance> spec;
  // Set by RunServeBench when a served node exposes prefix-cache or KV-transfer counters: the
  // sum over the nodes, and each node's own.
  std::optional<CacheUsage> cache;
  std::vector<CacheUsage> cache_by_server;
  // Multi-turn runs (requests with turn > 0): turns 1..T, and the later turns when T > 1.
  std::vector<TurnTtft> ttft_by_turn;
  std::optional<TurnTtft> ttft_later_turns;
};

// Statistics helpers, exposed for tests. Percentile: p in [0, 100], linear interpolation.
double Mean(const std::vector<double>& v);
double Median(const std::vector<double>& v);
double PopulationStd(const std::vector<double>& v);
double Percentile(std::vector<double> v, double p);

// Computes every metric of `outcomes` over a run of `duration_s` (> 0) seconds.
ServeMetrics ComputeServeMetrics(const std::vector<RequestOutcome>& outcomes, double duration_s,
                                 const std::vector<double>& percentiles, const GoodputSlo& slo);

// The metrics part of the result file, under vllm's field names: duration, completed,
// failed, total_input_tokens, total_output_tokens, request_throughput, request_goodput (null
// without SLOs), output_throughput, total_token_throughput, input_lens, output_lens, ttfts,
// itls (seconds), errors, and {mean,median,std,pNN}_{metric}_ms for each metric in
// `percentile_metrics` (ttft, tpot, itl, e2el); with m.spec, vLLM's spec_decode_num_drafts,
// spec_decode_draft_tokens, spec_decode_accepted_tokens, spec_decode_acceptance_rate (percent),
// spec_decode_acceptance_length and spec_decode_per_position_acceptance_rates (fractions), the
// ratios null where undefined. With m.cache: prefix_cache_queries, prefix_cache_hits,
// prefix_cache_hit_rate (percent; null without queries), kv_bytes_sent, kv_bytes_received,
// kv_pages_not_transferred, kv_bytes_not_transferred (those some node exposes) and
// cache_by_server (the same per node, with its "server"). Multi-turn: conversations and turns
// (per request), ttft_by_turn ([{turn, completed, mean_input_len, {mean,median,std,pNN}_ttft_ms}])
// and later_turns (the same over turns 2..T).
nlohmann::json MetricsToJson(const ServeMetrics& m, const std::vector<RequestOutcome>& outcomes,
                             const std::vector<std::string>& percentile_metrics, bool has_slo);

// The table printed on stdout, laid out as vllm's (a "Speculative Decoding" part with m.spec).
std::string FormatMetricsTable(const ServeMetrics& m,
                               const std::vector<std::string>& percentile_metrics, bool has_slo);

}  // namespace pdserve::bench
