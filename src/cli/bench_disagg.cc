// `pdserve bench disagg`: its flags; the benchmark itself is bench/disagg_bench.h.
#include <cstdio>
#include <string>

#include "bench/disagg_bench.h"
#include "cli/commands.h"
#include "cli/model_flags.h"
#include "common/logging.h"
#include "kernels/dispatch.h"

namespace pdserve::cli {
namespace {

struct BenchDisaggFlags {
  ModelFlags model;
  int prompt_len = 2048;
  int repeats = 3;
  std::string provider = "shm";
  uint32_t seed = 1;
  int timeout_s = 600;
};

int RunBenchDisagg(const BenchDisaggFlags& f) {
  if (Status s = kernels::SelectPathFromEnvironment(); !s.ok()) return Fail(s.ToString());
  PD_LOG_INFO("kernels: {}", kernels::DescribeSelection());
  bench::DisaggBenchOptions options;
  options.model_dir = f.model.model;
  PD_ASSIGN_OR_RETURN_CLI(options.load, LoadOptionsFromFlags(f.model));
  options.engine = EngineOptionsFromFlags(f.model);
  options.prompt_len = f.prompt_len;
  options.repeats = f.repeats;
  options.provider = f.provider;
  options.seed = f.seed;
  options.timeout_s = f.timeout_s;
  PD_ASSIGN_OR_RETURN_CLI(bench::DisaggBenchResult result, bench::RunDisaggBench(options));
  std::printf("%s", bench::FormatDisaggTable(result).c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace

void AddBenchDisaggCommand(CLI::App& bench, int* exit_code) {
  auto flags = std::make_shared<BenchDisaggFlags>();
  CLI::App* cmd = bench.add_subcommand(
      "disagg", "KV streaming of one long prompt from a prefill to a decode node: compute vs tail");
  AddModelFlags(cmd, &flags->model);
  cmd->add_option("--prompt-len", flags->prompt_len,
                  "Prompt tokens (the prefill node prefills all but the last)")
      ->check(CLI::Range(2, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--repeats", flags->repeats, "Runs per mode, streaming on and off (medians)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->add_option("--fabric-provider", flags->provider, "KV transfer provider: shm | tcp")
      ->check(CLI::IsMember({"shm", "tcp"}))
      ->capture_default_str();
  cmd->add_option("--seed", flags->seed, "Seed of the random prompt")->capture_default_str();
  cmd->add_option("--timeout", flags->timeout_s, "Seconds each run may take")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  cmd->callback([flags, exit_code] { *exit_code = RunBenchDisagg(*flags); });
}

}  // namespace pdserve::cli
