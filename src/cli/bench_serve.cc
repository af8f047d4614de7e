// `pdserve bench serve`: its flags; the load generator itself is bench/serve_bench.h.
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench/serve_bench.h"
#include "cli/bench_serve_flags.h"
#include "cli/commands.h"
#include "cli/model_flags.h"

namespace pdserve::cli {
namespace {

struct BenchServeFlags {
  ServeRunFlags run;
  std::string base_url;
  std::string request_rate = "inf";
  std::string result_file;
  std::vector<std::string> metrics_urls;
};

std::vector<std::string> SplitCommas(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

// A finite number or "inf"; false on anything else.
bool ParseRate(const std::string& text, double* rate) {
  if (text == "inf") {
    *rate = std::numeric_limits<double>::infinity();
    return true;
  }
  char* end = nullptr;
  *rate = std::strtod(text.c_str(), &end);
  return end != text.c_str() && *end == '\0' && std::isfinite(*rate) && *rate > 0;
}

int RunBenchServe(BenchServeFlags& f) {
  PD_ASSIGN_OR_RETURN_CLI(bench::ServeBenchOptions options, ServeOptionsFromFlags(&f.run));
  options.base_url = f.base_url;
  if (!ParseRate(f.request_rate, &options.arrivals.request_rate)) {
    return Fail("--request-rate must be a positive number or inf, got '" + f.request_rate + "'");
  }
  options.result_file = f.result_file;
  options.metrics_urls = f.metrics_urls;
  PD_ASSIGN_OR_RETURN_CLI(std::vector<bench::SampleRequest> requests,
                          bench::LoadServeDataset(f.run.dataset, f.base_url, f.run.model));
  PD_ASSIGN_OR_RETURN_CLI(bench::ServeBenchResult result, bench::RunServeBench(options, requests));
  // A run where every request failed measured nothing: say so through the exit code.
  return result.metrics.completed > 0
             ? 0
             : Fail("every request failed; first error: " + result.outcomes.front().error);
}

}  // namespace

void AddServeRunFlags(CLI::App* cmd, ServeRunFlags* flags, const std::string& num_prompts_help) {
  // Checked when a run starts: `bench sweep --plot-only` needs none.
  cmd->add_option("--model", flags->model, "Model name sent in every request (required)");
  cmd->add_option("--endpoint-type", flags->endpoint_type,
                  "completions (/v1/completions) or chat (/v1/chat/completions)")
      ->capture_default_str();
  cmd->add_option("--dataset", flags->dataset.name,
                  "random: random-word prompts of exact token counts; shared-prefix: prompts "
                  "sharing --num-prefixes prefixes of --prefix-len tokens; multi-turn: "
                  "conversations replayed turn after turn; jsonl: --dataset-path")
      ->capture_default_str();
  cmd->add_option("--dataset-path", flags->dataset.path,
                  "JSONL file, one {\"prompt\": STRING, \"output_len\": INT[, \"prompt_len\": "
                  "INT]} per line");
  cmd->add_option("--tokenizer", flags->dataset.tokenizer_dir,
                  "Model directory whose tokenizer counts prompt tokens (default: the server's "
                  "/tokenize and /detokenize)");
  cmd->add_option("--random-input-len", flags->dataset.random.input_len, "Prompt tokens")
      ->capture_default_str();
  cmd->add_option("--random-output-len,--output-len", flags->dataset.random.output_len,
                  "Output tokens (random, shared-prefix and multi-turn datasets)")
      ->capture_default_str();
  cmd->add_option("--random-range-ratio", flags->dataset.random.range_ratio,
                  "Lengths drawn uniformly from [len*(1-r), len*(1+r)], r in [0, 1)")
      ->capture_default_str();
  // shared-prefix: the names of vLLM's prefix_repetition dataset work too.
  cmd->add_option("--prefix-len,--prefix-repetition-prefix-len",
                  flags->dataset.shared_prefix.prefix_len, "shared-prefix: tokens of each prefix")
      ->capture_default_str();
  cmd->add_option("--suffix-len,--prefix-repetition-suffix-len",
                  flags->dataset.shared_prefix.suffix_len,
                  "shared-prefix: tokens after the prefix, each prompt's own")
      ->capture_default_str();
  cmd->add_option("--num-prefixes,--prefix-repetition-num-prefixes",
                  flags->dataset.shared_prefix.num_prefixes,
                  "shared-prefix: distinct prefixes (prompt i has prefix i mod this)")
      ->capture_default_str();
  cmd->add_option("--num-conversations", flags->dataset.multi_turn.num_conversations,
                  "multi-turn: conversations (they arrive as --request-rate says; --num-prompts "
                  "is not used)")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  cmd->add_option("--num-turns", flags->dataset.multi_turn.num_turns,
                  "multi-turn: requests per conversation, each sent once the previous finished")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  cmd->add_option("--system-prompt-len", flags->dataset.multi_turn.system_prompt_len,
                  "multi-turn: tokens of the system prompt every conversation starts with")
      ->capture_default_str();
  cmd->add_option("--user-len", flags->dataset.multi_turn.user_len,
                  "multi-turn: tokens of each user message")
      ->capture_default_str();
  cmd->add_option("--answer-len", flags->dataset.multi_turn.answer_len,
                  "multi-turn: tokens of each replayed assistant answer (the transcript's, not "
                  "the server's)")
      ->capture_default_str();
  flags->dataset.random.num_prompts = 100;
  cmd->add_option("--num-prompts", flags->dataset.random.num_prompts, num_prompts_help)
      ->check(CLI::Range(1, 10000000))
      ->capture_default_str();
  cmd->add_option("--num-warmups", flags->num_warmups,
                  "Untimed requests (the first prompt) sent before each run")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  cmd->add_option("--burstiness", flags->burstiness,
                  "Gamma shape of inter-arrival times (1: Poisson; <1 burstier)")
      ->capture_default_str();
  cmd->add_option("--max-concurrency", flags->max_concurrency,
                  "Most requests in flight (0: no limit)")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  cmd->add_option("--seed", flags->seed, "Seed of arrivals and the random dataset")
      ->capture_default_str();
  cmd->add_option("--percentile-metrics", flags->percentile_metrics,
                  "Metrics reported: ttft,tpot,itl,e2el")
      ->capture_default_str();
  cmd->add_option("--metric-percentiles", flags->metric_percentiles,
                  "Percentiles reported, comma-separated")
      ->capture_default_str();
  cmd->add_option("--goodput", flags->goodput,
                  "SLOs as NAME:MS pairs (ttft, tpot, e2el; itl: the largest gap); goodput counts "
                  "requests meeting all");
  cmd->add_option("--request-timeout", flags->request_timeout_s, "Seconds per request")
      ->check(CLI::Range(0.001, 86400.0))
      ->capture_default_str();
  cmd->add_flag("--disable-progress", flags->disable_progress,
                "No progress bar (it shows only when stderr is a terminal)");
}

Result<bench::ServeBenchOptions> ServeOptionsFromFlags(ServeRunFlags* f) {
  bench::ServeBenchOptions options;
  if (f->model.empty()) return Status::InvalidArgument("--model is required");
  options.model = f->model;
  if (f->endpoint_type != "completions" && f->endpoint_type != "chat") {
    return Status::InvalidArgument("--endpoint-type must be completions or chat");
  }
  options.endpoint =
      f->endpoint_type == "chat" ? bench::EndpointType::kChat : bench::EndpointType::kCompletions;
  options.arrivals.burstiness = f->burstiness;
  options.arrivals.seed = f->seed;
  options.max_concurrency = f->max_concurrency;
  options.num_warmups = f->num_warmups;
  options.percentile_metrics = SplitCommas(f->percentile_metrics);
  options.percentiles.clear();
  for (const std::string& p : SplitCommas(f->metric_percentiles)) {
    char* end = nullptr;
    options.percentiles.push_back(std::strtod(p.c_str(), &end));
    if (end == p.c_str() || *end != '\0') {
      return Status::InvalidArgument("--metric-percentiles: '" + p + "'");
    }
  }
  PD_ASSIGN_OR_RETURN(options.slo, bench::ParseGoodput(f->goodput));
  options.request_timeout =
      std::chrono::duration_cast<Duration>(std::chrono::duration<double>(f->request_timeout_s));
  options.progress = !f->disable_progress && isatty(STDERR_FILENO) == 1;
  options.dataset_name = f->dataset.name;
  options.tokenizer_id = f->dataset.tokenizer_dir.empty() ? "server" : f->dataset.tokenizer_dir;
  f->dataset.random.seed = f->seed;
  return options;
}

void AddBenchServeCommand(CLI::App& bench, int* exit_code) {
  auto flags = std::make_shared<BenchServeFlags>();
  CLI::App* cmd = bench.add_subcommand(
      "serve", "Load an OpenAI-compatible endpoint; TTFT/TPOT/ITL/E2EL and goodput as vllm");
  cmd->add_option("--base-url", flags->base_url, "Server, http://HOST:PORT[/PREFIX]")->required();
  AddServeRunFlags(cmd, &flags->run, "Timed requests");
  cmd->add_option("--request-rate", flags->request_rate,
                  "Requests per second, or inf (all at once)")
      ->capture_default_str();
  cmd->add_option("--result-file", flags->result_file, "Write the JSON result here");
  cmd->add_option("--metrics-url", flags->metrics_urls,
                  "Server whose /metrics give the run's speculative-decoding acceptance, "
                  "prefix-cache hits and KV bytes transferred (counters before and after the "
                  "run); repeat for several, e.g. the prefill and decode nodes behind a router "
                  "(default: --base-url)");
  cmd->callback([flags, exit_code] { *exit_code = RunBenchServe(*flags); });
}

}  // namespace pdserve::cli
