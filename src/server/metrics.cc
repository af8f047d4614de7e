#include "server/metrics.h"

#include <algorithm>
#include <string>

#include "common/metrics_text.h"

namespace pdserve::server {

namespace {

// vLLM's bucket boundaries, so dashboards built for it read pdserve the same way.
const std::vector<double> kTtftBounds = {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
                                         0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
                                         20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kItlBounds = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                        0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> kE2eBounds = {0.3,  0.5,   0.8,   1.0,   1.5,   2.0,    2.5,
                                        5.0,  10.0,  15.0,  20.0,  30.0,  40.0,   50.0,
                                        60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

// Speculative decoding, in vLLM's names and meanings (its counters, which Prometheus's client
// library exposes with _total), and the drafter's cache as pdserve's own gauges.
void RenderSpecDecode(const EngineStats& stats, MetricsText& out) {
  const SpecDecodeStats& s = stats.spec;
  out.Counter("vllm:spec_decode_num_drafts_total",
              "Runs of drafted tokens verified (one per sequence and step that drafted).",
              static_cast<double>(s.drafts))
      .Counter("vllm:spec_decode_num_draft_tokens_total", "Drafted tokens verified.",
               static_cast<double>(s.draft_tokens))
      .Counter("vllm:spec_decode_num_accepted_tokens_total",
               "Drafted tokens accepted by verification.", static_cast<double>(s.accepted_tokens))
      .Family("vllm:spec_decode_num_accepted_tokens_per_pos_total", MetricType::kCounter,
              "Drafts whose token at this position (0 = the first drafted) was accepted.");
  for (size_t i = 0; i < s.accepted_per_position.size(); ++i) {
    out.Sample("vllm:spec_decode_num_accepted_tokens_per_pos_total",
               {{"position", std::to_string(i)}}, static_cast<double>(s.accepted_per_position[i]));
  }
  out.Gauge("pdserve:spec_decode_num_speculative_tokens",
            "Tokens drafted per sequence and step (--num-speculative-tokens).",
            stats.num_speculative_tokens)
      .Gauge("pdserve:spec_decode_draft_pages_used", "Pages in use in the drafter's KV cache.",
             s.draft_pages_used)
      .Gauge("pdserve:spec_decode_draft_pages_total", "Pages of the drafter's KV cache.",
             s.draft_pages_total);
}

// What the Gateway API inference extension's endpoint picker (EPP) scrapes, under the vLLM
// names it reads by default (its model server protocol, docs/api.md "External schedulers"):
// queue, batch and KV-cache use to pick an endpoint, the cache's page size and count for its
// prefix-cache scorer. No vllm:lora_requests_info: pdserve serves no LoRA adapters, and vLLM
// without them exposes none either.
void RenderSchedulerGauges(const EngineStats& stats, double kv_usage, MetricsText& out) {
  out.Gauge("vllm:num_requests_running", "Requests in the engine's running batch.", stats.running)
      // vLLM counts a request waiting for its KV from another node (WAITING_FOR_REMOTE_KVS) as
      // waiting: so does pdserve's decode node, whose pdserve:num_requests_waiting does not.
      .Gauge("vllm:num_requests_waiting",
             "Requests accepted and not yet in the running batch, including those whose KV is "
             "still arriving from a prefill node.",
             stats.waiting + stats.awaiting_kv)
      .Gauge("vllm:kv_cache_usage_perc", "Fraction of KV cache pages in use (0 to 1).", kv_usage)
      .Gauge("vllm:gpu_cache_usage_perc",
             "Fraction of KV cache pages in use (0 to 1); vLLM's name before "
             "vllm:kv_cache_usage_perc, read by older endpoint pickers.",
             kv_usage)
      .Family("vllm:cache_config_info", MetricType::kGauge,
              "KV cache configuration: tokens per page (block_size) and pages (num_gpu_blocks).")
      .Sample("vllm:cache_config_info",
              {{"block_size", std::to_string(stats.page_tokens)},
               {"num_gpu_blocks", std::to_string(stats.pages_total)}},
              1);
}

}  // namespace

ServerMetrics::ServerMetrics() : ttft_(kTtftBounds), itl_(kItlBounds), e2e_(kE2eBounds) {}

void ServerMetrics::ObserveTimeToFirstToken(double s) {
  MutexLock lock(&mu_);
  ttft_.Observe(s);
}
void ServerMetrics::ObserveInterTokenLatency(double s) {
  MutexLock lock(&mu_);
  itl_.Observe(s);
}
void ServerMetrics::ObserveE2eLatency(double s) {
  MutexLock lock(&mu_);
  e2e_.Observe(s);
}
void ServerMetrics::AddPromptTokens(int64_t n) {
  MutexLock lock(&mu_);
  prompt_tokens_ += n;
}
void ServerMetrics::AddGenerationTokens(int64_t n) {
  MutexLock lock(&mu_);
  generation_tokens_ += n;
}
void ServerMetrics::RequestSucceeded(const std::string& finish_reason) {
  MutexLock lock(&mu_);
  ++success_[finish_reason];
}
void ServerMetrics::RequestFailed(int http_status) {
  MutexLock lock(&mu_);
  ++errors_[http_status];
}

std::string ServerMetrics::Render(const EngineStats& stats) const {
  MetricsText out;
  const double kv_usage =
      stats.pages_total > 0 ? static_cast<double>(stats.pages_used) / stats.pages_total : 0.0;
  out.Gauge("pdserve:num_requests_running", "Requests in the engine's running batch.",
            stats.running)
      .Gauge("pdserve:num_requests_waiting", "Requests queued in the engine, not yet running.",
             stats.waiting)
      .Gauge("pdserve:kv_cache_usage_perc", "Fraction of KV cache pages in use (0 to 1).", kv_usage)
      // The page pool in pages: on a decode node, pages held for KV in flight count as used.
      // Cached pages no request holds are not used: they are evicted as pages are needed.
      .Gauge("pdserve:kv_pages_used",
             "KV cache pages in use (held by requests, or pinned for KV in flight).",
             stats.pages_used)
      .Gauge("pdserve:kv_pages_total", "KV cache pages in the pool.", stats.pages_total)
      .Gauge("pdserve:kv_pages_cached",
             "KV cache pages holding a cached prompt prefix, held by requests or not.",
             stats.pages_cached)
      .Gauge("pdserve:kv_pages_evictable",
             "Cached KV cache pages no request holds (kept until their memory is needed).",
             stats.pages_evictable)
      // vLLM's prefix-cache counters (Prometheus's client library adds _total), in tokens.
      .Counter("vllm:prefix_cache_queries_total",
               "Prefix cache queries, in tokens: each request's tokens when it is first admitted.",
               static_cast<double>(stats.prefix_cache.queries))
      .Counter("vllm:prefix_cache_hits_total",
               "Prefix cache hits, in tokens: queried tokens whose KV was found cached.",
               static_cast<double>(stats.prefix_cache.hits))
      .Gauge("pdserve:tensor_parallel_size", "Tensor-parallel ranks computing each step.",
             stats.tp_size)
      .Counter("pdserve:num_preemptions_total", "Sequences preempted for lack of KV pages.",
               static_cast<double>(stats.preemptions));
  RenderSchedulerGauges(stats, kv_usage, out);
  if (stats.num_speculative_tokens > 0) RenderSpecDecode(stats, out);
  MutexLock lock(&mu_);
  out.Counter("pdserve:prompt_tokens_total", "Prompt tokens processed.",
              static_cast<double>(prompt_tokens_))
      .Counter("pdserve:generation_tokens_total", "Tokens generated.",
               static_cast<double>(generation_tokens_))
      .Family("pdserve:request_success_total", MetricType::kCounter,
              "Requests finished, by finish reason.");
  for (const char* reason : {"stop", "length"}) {
    auto it = success_.find(reason);
    out.Sample("pdserve:request_success_total", {{"finished_reason", reason}},
               static_cast<double>(it == success_.end() ? 0 : it->second));
  }
  out.Family("pdserve:request_error_total", MetricType::kCounter,
             "Requests answered with an error, by HTTP status.");
  for (const auto& [status, n] : errors_) {
    out.Sample("pdserve:request_error_total", {{"status", std::to_string(status)}},
               static_cast<double>(n));
  }
  out.Histogram("pdserve:time_to_first_token_seconds", "Time to first token.", ttft_)
      .Histogram("pdserve:inter_token_latency_seconds", "Time between consecutive output tokens.",
                 itl_)
      .Histogram("pdserve:e2e_request_latency_seconds", "Request latency, arrival to last token.",
                 e2e_);
  return out.text();
}

}  // namespace pdserve::server
