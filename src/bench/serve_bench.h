// `pdserve bench serve`: a load generator for any OpenAI-compatible endpoint, measuring what
// `vllm bench serve` measures (see serve_metrics.h). The calling thread dispatches requests at
// their arrival times (serve_arrivals.h), holding back while --max-concurrency requests are in
// flight; each request runs on its own thread and connection (serve_client.h). A multi-turn
// dataset's conversations arrive instead of its requests: a conversation's turns are sent one
// after the other, each once the previous one has finished, and the conversation holds one
// --max-concurrency slot until its last turn has finished. Warm-up
// requests (the first prompt, repeated) run before the timed run and are not counted.
// Call RunServeBench from one thread; it returns when every request has finished or timed out.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/serve_arrivals.h"
#include "bench/serve_client.h"
#include "bench/serve_dataset.h"
#include "bench/serve_metrics.h"
#include "common/clock.h"
#include "common/status.h"

namespace pdserve::bench {

struct ServeBenchOptions {
  std::string base_url;  // http://HOST:PORT[/PREFIX]
  std::string model;
  EndpointType endpoint = EndpointType::kCompletions;
  ArrivalOptions arrivals;
  int max_concurrency = 0;  // 0: no limit but the generator's own (1024 in flight)
  int num_warmups = 0;
  std::vector<std::string> percentile_metrics = {"ttft", "tpot", "itl", "e2el"};
  std::vector<double> percentiles = {50, 90, 99};
  GoodputSlo slo;
  Duration request_timeout = std::chrono::seconds(600);
  bool progress = false;    // the one-line progress bar on stderr
  bool print_table = true;  // the table on stdout
  std::string result_file;  // JSON result; empty: none
  // Servers whose /metrics give the run's speculative-decoding acceptance, prefix-cache hits
  // and KV bytes transferred, summed over them ("http://HOST:PORT[/PREFIX]", "/metrics"
  // appended unless given): behind a router, its decode nodes (and prefill nodes, for the
  // bytes they sent). Empty: base_url's own. A server without such counters (or without
  // /metrics) adds nothing; when none has them the result has none of those figures.
  std::vector<std::string> metrics_urls;
  // How long a scrape waits for the servers' running requests to reach 0 (a node publishes
  // its counters with the step that finishes a request, which may follow its last chunk).
  Duration metrics_idle_wait = std::chrono::seconds(5);
  // Recorded in the result file only.
  std::string dataset_name;
  std::string tokenizer_id;
};

struct ServeBenchResult {
  ServeMetrics metrics;
  std::vector<RequestOutcome> outcomes;  // in dataset order
  nlohmann::json json;                   // what the result file holds
};

// Which dataset and how to count its tokens (serve_dataset.h).
struct ServeDatasetOptions {
  std::string name = "random";  // "random" | "shared-prefix" | "multi-turn" | "jsonl"
  // num_prompts, output_len and seed are used by every dataset (num_prompts not by
  // multi-turn, whose requests are its conversations' turns).
  RandomDatasetOptions random;
  SharedPrefixDatasetOptions shared_prefix;  // prefix_len, suffix_len, num_prefixes
  MultiTurnDatasetOptions multi_turn;        // all but output_len and seed
  std::string path;                          // jsonl
  std::string tokenizer_dir;                 // empty: the server's /tokenize
};

// Builds the dataset; errors name the flag or the file at fault.
Result<std::vector<SampleRequest>> LoadServeDataset(const ServeDatasetOptions& options,
                                                    const std::string& base_url,
                                                    const std::string& model);

// Runs the benchmark over `requests`. InvalidArgument on bad options; a run whose requests
// fail still returns (with failed > 0); writing the result file may fail with IoError.
Result<ServeBenchResult> RunServeBench(const ServeBenchOptions& options,
                                       const std::vector<SampleRequest>& requests);

}  // namespace pdserve::bench
