// `pdserve bench engine`: its flags; the benchmark itself is bench/engine_bench.h.
#include <sstream>
#include <string>
#include <vector>

#include "bench/engine_bench.h"
#include "cli/commands.h"
#include "cli/model_flags.h"
#include "common/logging.h"
#include "kernels/dispatch.h"

namespace pdserve::cli {
namespace {

struct BenchEngineFlags {
  ModelFlags model;
  std::string batches = "1,8,32";
  std::string contexts;  // empty: bench::kDefaultDecodeContexts
  int prompt_len = 512;
  int decode_steps = 8;  // at least this many timed steps per round
  int repeats = 3;
  std::string kernels;  // kernel path; empty = PDSERVE_KERNELS or the best this CPU runs
};

// Parses a comma-separated list of positive integers into *out; false if it is not one.
bool ParsePositiveList(const std::string& text, std::vector<int>* out) {
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    try {
      out->push_back(std::stoi(item, &used));
    } catch (const std::exception&) {
      return false;
    }
    if (used != item.size() || out->back() <= 0) return false;
  }
  return !out->empty();
}

int RunBenchEngine(BenchEngineFlags& f) {
  std::vector<int> batches, contexts;
  if (!ParsePositiveList(f.batches, &batches)) {
    return Fail("--batch must be a comma-separated list of positive integers");
  }
  if (!f.contexts.empty() && !ParsePositiveList(f.contexts, &contexts)) {
    return Fail("--context must be a comma-separated list of positive integers");
  }
  if (Status s =
          f.kernels.empty() ? kernels::SelectPathFromEnvironment() : kernels::SelectPath(f.kernels);
      !s.ok()) {
    return Fail(s.ToString());
  }
  PD_LOG_INFO("kernels: {}", kernels::DescribeSelection());
  PD_ASSIGN_OR_RETURN_CLI(ModelDir dir, LoadFromFlags(f.model));
  bench::EngineBenchOptions options;
  options.batches = batches;
  options.contexts = contexts;
  options.prompt_len = f.prompt_len;
  options.decode_steps = f.decode_steps;
  options.repeats = f.repeats;
  options.threads = f.model.threads;
  options.page_tokens = f.model.page_size;
  const Status status = bench::RunEngineBench(dir, options);
  if (!status.ok()) return Fail(status.ToString());
  return 0;
}

}  // namespace

void AddBenchEngineCommand(CLI::App& bench, int* exit_code) {
  auto flags = std::make_shared<BenchEngineFlags>();
  CLI::App* cmd = bench.add_subcommand("engine", "Prefill/decode throughput vs measured ceilings");
  AddModelFlags(cmd, &flags->model);
  cmd->add_option("--batch", flags->batches, "Decode batch sizes, comma-separated")
      ->capture_default_str();
  cmd->add_option("--context", flags->contexts,
                  "Decode contexts (tokens already in each sequence), comma-separated "
                  "(default: 256,1024,2048,4096, those the model's context holds)");
  cmd->add_option("--prompt-len", flags->prompt_len, "Prompt tokens of the prefill row")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--decode-steps", flags->decode_steps,
                  "Least number of timed decode steps per round")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_option("--repeats", flags->repeats,
                  "Rounds per figure, each with its own ceiling (medians reported)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->add_option("--kernels", flags->kernels,
                  "Kernel path: amx, avx512, avx2, amx-model (AMX tile kernel on the software "
                  "model of the tiles), generic or auto (default: $PDSERVE_KERNELS, else the "
                  "best this CPU runs)");
  cmd->callback([flags, exit_code] { *exit_code = RunBenchEngine(*flags); });
}

}  // namespace pdserve::cli
