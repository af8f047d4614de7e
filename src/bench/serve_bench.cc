#include "bench/serve_bench.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "common/mutex.h"

namespace pdserve::bench {
namespace {

using nlohmann::json;

// Each request in flight holds a thread and a connection; without --max-concurrency this bounds
// them so that a large --num-prompts at rate inf cannot exhaust the process's threads.
constexpr int kMaxInFlight = 1024;

// Counts requests in flight; Acquire waits for a free slot up to a deadline.
class InFlightLimit {
 public:
  explicit InFlightLimit(int limit) : limit_(limit) {}
  bool Acquire(Deadline deadline) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    while (in_flight_ >= limit_) {
      if (cv_.WaitUntil(&mu_, deadline.at()) == std::cv_status::timeout && in_flight_ >= limit_) {
        return false;
      }
    }
    ++in_flight_;
    return true;
  }
  void Release() EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      --in_flight_;
    }
    cv_.NotifyOne();
  }

 private:
  const int limit_;
  Mutex mu_;
  CondVar cv_;
  int in_flight_ GUARDED_BY(mu_) = 0;
};

// The one-line progress bar on stderr, redrawn by its own thread until destroyed.
class ProgressBar {
 public:
  ProgressBar(bool enabled, const char* label, int total, const std::atomic<int>* done,
              const std::atomic<int>* failed)
      : enabled_(enabled), label_(label), total_(total), done_(done), failed_(failed) {
    if (enabled_) thread_ = std::thread([this] { Loop(); });
  }
  ~ProgressBar() {
    if (!enabled_) return;
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    cv_.NotifyAll();
    thread_.join();
    Draw();
    std::fputc('\n', stderr);
  }
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

 private:
  void Loop() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    while (!stop_) {
      if (cv_.WaitFor(&mu_, std::chrono::milliseconds(200)) == std::cv_status::timeout) Draw();
    }
  }
  void Draw() const {
    const int done = done_->load();
    const int width = 30;
    const int filled = total_ > 0 ? done * width / total_ : width;
    std::fprintf(stderr, "\r%s [%s%s] %d/%d (%d failed) %.1f s", label_,
                 std::string(static_cast<size_t>(filled), '#').c_str(),
                 std::string(static_cast<size_t>(width - filled), ' ').c_str(), done, total_,
                 failed_->load(), SecondsSince(start_));
    std::fflush(stderr);
  }

  const bool enabled_;
  const char* const label_;
  const int total_;
  const std::atomic<int>* const done_;
  const std::atomic<int>* const failed_;
  const TimePoint start_ = Clock::now();
  Mutex mu_;
  CondVar cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// Sends the requests, at most `max_concurrency` in flight, and returns their outcomes in
// order. A chain is a list of request indices sent one after the other, each once its
// predecessor has finished (a multi-turn conversation; every other request is a chain of one);
// chain c starts at start + send_times[c] (all at once when send_times is empty) and holds one
// slot of the concurrency limit until its last request has finished.
std::vector<RequestOutcome> RunRequests(const ServerAddress& server,
                                        const std::vector<StreamRequest>& requests,
                                        const std::vector<std::vector<size_t>>& chains,
                                        const std::vector<double>& send_times,
                                        const ServeBenchOptions& options, const char* label) {
  std::vector<RequestOutcome> outcomes(requests.size());
  std::atomic<int> done{0}, failed{0};
  InFlightLimit limit(options.max_concurrency > 0 ? options.max_concurrency : kMaxInFlight);
  size_t longest_chain = 1;
  for (const std::vector<size_t>& chain : chains)
    longest_chain = std::max(longest_chain, chain.size());
  std::vector<std::thread> threads;
  threads.reserve(chains.size());
  {
    ProgressBar bar(options.progress, label, static_cast<int>(requests.size()), &done, &failed);
    const TimePoint start = Clock::now();
    for (size_t c = 0; c < chains.size(); ++c) {
      if (!send_times.empty()) {
        std::this_thread::sleep_until(start + std::chrono::duration_cast<Duration>(
                                                  std::chrono::duration<double>(send_times[c])));
      }
      // A slot frees when a chain ends, which its requests' own timeouts bound; the margin
      // covers connection set-up and teardown.
      if (!limit.Acquire(Deadline::After(options.request_timeout * static_cast<int>(longest_chain) +
                                         std::chrono::seconds(60)))) {
        for (size_t i : chains[c]) {
          outcomes[i].error = "no request slot freed in time";
          outcomes[i].prompt_len = requests[i].prompt_len;
          ++failed;
          ++done;
        }
        continue;
      }
      threads.emplace_back([&, c] {
        // A failed turn does not end its conversation: the next turn's prompt is the
        // transcript's, whatever the server answered.
        for (size_t i : chains[c]) {
          outcomes[i] = StreamCompletion(server, requests[i], options.request_timeout);
          if (!outcomes[i].success) ++failed;
          ++done;
        }
        limit.Release();
      });
    }
    for (std::thread& t : threads) t.join();
  }
  return outcomes;
}

// Every request a chain of its own, or, for a multi-turn dataset, one chain per conversation
// (its requests are consecutive and in turn order: serve_dataset.h).
std::vector<std::vector<size_t>> ChainsOf(const std::vector<SampleRequest>& requests) {
  std::vector<std::vector<size_t>> chains;
  for (size_t i = 0; i < requests.size(); ++i) {
    const int conversation = requests[i].conversation;
    if (conversation >= 0 && i > 0 && requests[i - 1].conversation == conversation) {
      chains.back().push_back(i);
    } else {
      chains.push_back({i});
    }
  }
  return chains;
}

std::vector<std::vector<size_t>> SingleChains(size_t n) {
  std::vector<std::vector<size_t>> chains;
  for (size_t i = 0; i < n; ++i) chains.push_back({i});
  return chains;
}

std::string NowString() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", &tm);
  return buf;
}

// The URLs named by --metrics-url, or base_url without them.
std::vector<std::string> MetricsUrls(const ServeBenchOptions& options) {
  return options.metrics_urls.empty() ? std::vector<std::string>{options.base_url}
                                      : options.metrics_urls;
}

// The servers named by --metrics-url (base_url without them), "/metrics" taken off the path.
Result<std::vector<ServerAddress>> MetricsServers(const ServeBenchOptions& options) {
  std::vector<ServerAddress> servers;
  const std::vector<std::string> urls = MetricsUrls(options);
  for (const std::string& url : urls) {
    Result<ServerAddress> server = ParseBaseUrl(url);
    if (!server.ok()) return server.status().WithContext("--metrics-url");
    const std::string suffix = "/metrics";
    std::string& prefix = server->path_prefix;
    if (prefix.size() >= suffix.size() &&
        prefix.compare(prefix.size() - suffix.size(), suffix.size(), suffix) == 0) {
      prefix.resize(prefix.size() - suffix.size());
    }
    servers.push_back(*server);
  }
  return servers;
}

// Each server's /metrics text, read once it runs no request (its running gauge, pdserve's or
// vLLM's, at 0) or when `wait` has passed; nullopt for a server that did not answer.
std::vector<std::optional<std::string>> ScrapeMetrics(const std::vector<ServerAddress>& servers,
                                                      Duration wait) {
  std::vector<std::optional<std::string>> texts;
  const Deadline deadline = Deadline::After(wait);
  for (const ServerAddress& server : servers) {
    Result<std::string> text = Status::Unavailable("not read");
    while (true) {
      text = GetText(server, "/metrics", std::chrono::seconds(10));
      if (!text.ok() || deadline.Passed()) break;
      const double running = SumOfSamples(*text, "pdserve:num_requests_running").value_or(0) +
                             SumOfSamples(*text, "vllm:num_requests_running").value_or(0);
      if (running <= 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    texts.push_back(text.ok() ? std::optional<std::string>(std::move(*text)) : std::nullopt);
  }
  return texts;
}

// The servers' speculative-decoding counters, summed; nullopt when none shows such counters.
std::optional<SpecDecodeCounters> SumSpecCounters(
    const std::vector<std::optional<std::string>>& texts) {
  std::optional<SpecDecodeCounters> sum;
  for (const std::optional<std::string>& text : texts) {
    if (!text) continue;
    if (std::optional<SpecDecodeCounters> c = ParseSpecDecodeCounters(*text)) {
      if (!sum) sum.emplace();
      AddSpecDecodeCounters(*sum, *c);
    }
  }
  return sum;
}

// The run's prefix-cache and KV-transfer usage per server that exposes such counters both
// times (named by its URL), into `m`.
void SetCacheUsage(const std::vector<std::string>& urls,
                   const std::vector<std::optional<std::string>>& before,
                   const std::vector<std::optional<std::string>>& after, ServeMetrics& m) {
  for (size_t i = 0; i < urls.size() && i < before.size() && i < after.size(); ++i) {
    if (!before[i] || !after[i]) continue;
    const CacheCounters b = ParseCacheCounters(*before[i]);
    const CacheCounters a = ParseCacheCounters(*after[i]);
    if (!b.any() || !a.any()) continue;
    CacheUsage usage = CacheUsageBetween(b, a);
    usage.server = urls[i];
    m.cache_by_server.push_back(std::move(usage));
  }
  if (!m.cache_by_server.empty()) m.cache = SumCacheUsage(m.cache_by_server);
}

Status ValidateOptions(const ServeBenchOptions& options, size_t num_requests) {
  PD_RETURN_IF_ERROR(ValidateArrivals(options.arrivals));
  if (num_requests == 0) return Status::InvalidArgument("no requests to send");
  if (options.model.empty()) return Status::InvalidArgument("--model is required");
  if (options.max_concurrency < 0) return Status::InvalidArgument("--max-concurrency < 0");
  if (options.num_warmups < 0) return Status::InvalidArgument("--num-warmups < 0");
  for (const std::string& m : options.percentile_metrics) {
    if (m != "ttft" && m != "tpot" && m != "itl" && m != "e2el") {
      return Status::InvalidArgument("--percentile-metrics: unknown metric '" + m +
                                     "' (ttft, tpot, itl, e2el)");
    }
  }
  for (double p : options.percentiles) {
    if (!(p > 0 && p < 100)) {
      return Status::InvalidArgument(fmt::format("--metric-percentiles: {} is not in (0, 100)", p));
    }
  }
  return Status::Ok();
}

}  // namespace

Result<std::vector<SampleRequest>> LoadServeDataset(const ServeDatasetOptions& options,
                                                    const std::string& base_url,
                                                    const std::string& model) {
  if (options.random.num_prompts < 1) return Status::InvalidArgument("--num-prompts must be >= 1");
  std::unique_ptr<PromptTokenizer> tokenizer;
  if (!options.tokenizer_dir.empty()) {
    PD_ASSIGN_OR_RETURN(tokenizer, LocalPromptTokenizer(options.tokenizer_dir));
  } else {
    PD_ASSIGN_OR_RETURN(ServerAddress server, ParseBaseUrl(base_url));
    tokenizer = RemotePromptTokenizer(server, model);
  }
  if (options.name == "random") {
    auto requests = RandomDataset(options.random, *tokenizer);
    if (!requests.ok() && options.tokenizer_dir.empty()) {
      return requests.status().WithContext(
          "the random dataset counts tokens with the server's /tokenize (or give --tokenizer)");
    }
    return requests;
  }
  if (options.name == "shared-prefix") {
    SharedPrefixDatasetOptions shared = options.shared_prefix;
    shared.num_prompts = options.random.num_prompts;
    shared.output_len = options.random.output_len;
    shared.seed = options.random.seed;
    return SharedPrefixDataset(shared, *tokenizer);
  }
  if (options.name == "multi-turn") {
    MultiTurnDatasetOptions multi = options.multi_turn;
    multi.output_len = options.random.output_len;
    multi.seed = options.random.seed;
    return MultiTurnDataset(multi, *tokenizer);
  }
  if (options.name == "jsonl") {
    if (options.path.empty())
      return Status::InvalidArgument("--dataset jsonl needs --dataset-path");
    // Lines without prompt_len are counted locally only; the server's usage fills them in.
    return JsonlDataset(options.path, options.random.num_prompts,
                        options.tokenizer_dir.empty() ? nullptr : tokenizer.get());
  }
  return Status::InvalidArgument(
      "--dataset must be random, shared-prefix, multi-turn or jsonl, got '" + options.name + "'");
}

Result<ServeBenchResult> RunServeBench(const ServeBenchOptions& options,
                                       const std::vector<SampleRequest>& requests) {
  PD_RETURN_IF_ERROR(ValidateOptions(options, requests.size()));
  PD_ASSIGN_OR_RETURN(ServerAddress server, ParseBaseUrl(options.base_url));
  PD_ASSIGN_OR_RETURN(const std::vector<ServerAddress> metrics_servers, MetricsServers(options));
  std::vector<StreamRequest> stream_requests;
  for (const SampleRequest& r : requests) {
    stream_requests.push_back(
        StreamRequest{options.endpoint, options.model, r.prompt, r.prompt_len, r.output_len});
  }

  if (options.num_warmups > 0) {
    const std::vector<StreamRequest> warmups(static_cast<size_t>(options.num_warmups),
                                             stream_requests.front());
    RunRequests(server, warmups, SingleChains(warmups.size()), {}, options, "warm-up");
  }

  const std::vector<std::optional<std::string>> metrics_before =
      ScrapeMetrics(metrics_servers, options.metrics_idle_wait);
  // Arrivals start requests, or conversations: each conversation's later turns follow its
  // previous turn's end.
  const std::vector<std::vector<size_t>> chains = ChainsOf(requests);
  const std::vector<double> send_times =
      ArrivalTimes(static_cast<int>(chains.size()), options.arrivals);
  const TimePoint start = Clock::now();
  std::vector<RequestOutcome> outcomes =
      RunRequests(server, stream_requests, chains, send_times, options, "requests");
  const double duration = SecondsSince(start);
  for (size_t i = 0; i < outcomes.size(); ++i) {
    outcomes[i].conversation = requests[i].conversation;
    outcomes[i].turn = requests[i].turn;
  }
  const std::vector<std::optional<std::string>> metrics_after =
      ScrapeMetrics(metrics_servers, options.metrics_idle_wait);

  ServeBenchResult result;
  result.metrics = ComputeServeMetrics(outcomes, duration, options.percentiles, options.slo);
  const std::optional<SpecDecodeCounters> spec_before = SumSpecCounters(metrics_before);
  const std::optional<SpecDecodeCounters> spec_after = SumSpecCounters(metrics_after);
  if (spec_before && spec_after) {
    result.metrics.spec = SpecAcceptanceBetween(*spec_before, *spec_after);
  }
  SetCacheUsage(MetricsUrls(options), metrics_before, metrics_after, result.metrics);
  json j = {
      {"date", NowString()},
      {"endpoint_type", options.endpoint == EndpointType::kChat ? "openai-chat" : "openai"},
      {"backend", options.endpoint == EndpointType::kChat ? "openai-chat" : "openai"},
      {"model_id", options.model},
      {"tokenizer_id", options.tokenizer_id},
      {"dataset_name", options.dataset_name},
      {"num_prompts", requests.size()},
      {"num_warmups", options.num_warmups},
      {"burstiness", options.arrivals.burstiness},
      {"seed", options.arrivals.seed},
  };
  j["request_rate"] =
      std::isinf(options.arrivals.request_rate) ? json("inf") : json(options.arrivals.request_rate);
  j["max_concurrency"] =
      options.max_concurrency > 0 ? json(options.max_concurrency) : json(nullptr);
  j.update(MetricsToJson(result.metrics, outcomes, options.percentile_metrics, options.slo.any()));
  result.json = std::move(j);
  result.outcomes = std::move(outcomes);

  if (options.print_table) {
    std::cout << FormatMetricsTable(result.metrics, options.percentile_metrics, options.slo.any())
              << std::flush;
  }
  if (!options.result_file.empty()) {
    std::ofstream out(options.result_file);
    out << result.json.dump() << "\n";
    if (!out.flush()) return Status::IoError("cannot write --result-file " + options.result_file);
  }
  return result;
}

}  // namespace pdserve::bench
