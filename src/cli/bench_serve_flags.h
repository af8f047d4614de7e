// The flags `pdserve bench serve` and `pdserve bench sweep` share (everything that shapes one
// run: model, endpoint, dataset, arrivals, concurrency, warm-ups, metrics, SLOs, timeout), and
// their conversion to the load generator's options (bench/serve_bench.h). Used from main()
// only (single-threaded).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/serve_bench.h"
#include "common/status.h"

namespace pdserve::cli {

struct ServeRunFlags {
  bench::ServeDatasetOptions dataset;
  std::string model;
  std::string endpoint_type = "completions";
  double burstiness = 1.0;
  int max_concurrency = 0;
  int num_warmups = 0;
  uint64_t seed = 0;
  std::string percentile_metrics = "ttft,tpot,itl,e2el";
  std::string metric_percentiles = "50,90,99";
  std::vector<std::string> goodput;
  double request_timeout_s = 600;
  bool disable_progress = false;
};

// Registers the shared flags on `cmd`; `num_prompts_help` says what --num-prompts counts.
void AddServeRunFlags(CLI::App* cmd, ServeRunFlags* flags, const std::string& num_prompts_help);

// The options of one run (base_url, request_rate and result_file left for the caller), with
// flags->dataset's seed set from --seed. InvalidArgument names the bad flag.
Result<bench::ServeBenchOptions> ServeOptionsFromFlags(ServeRunFlags* flags);

}  // namespace pdserve::cli
