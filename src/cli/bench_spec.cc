// `pdserve bench spec`: its flags; the benchmark itself is bench/spec_bench.h.
#include <sstream>
#include <string>
#include <vector>

#include "bench/spec_bench.h"
#include "cli/commands.h"
#include "cli/model_flags.h"
#include "common/logging.h"
#include "kernels/dispatch.h"

namespace pdserve::cli {
namespace {

struct BenchSpecFlags {
  ModelFlags model;
  SpeculativeFlags speculative;
  std::string batches = "1,8";
  int prompt_len = 64;
  int max_tokens = 128;
};

int RunBenchSpec(const BenchSpecFlags& f) {
  bench::SpecBenchOptions options;
  options.batches.clear();
  std::stringstream ss(f.batches);
  for (std::string item; std::getline(ss, item, ',');) {
    const int b = std::atoi(item.c_str());
    if (b <= 0) return Fail("--batch must be a comma-separated list of positive integers");
    options.batches.push_back(b);
  }
  if (f.speculative.method.empty()) return Fail("bench spec needs --speculative draft or mtp");
  options.prompt_len = f.prompt_len;
  options.max_tokens = f.max_tokens;
  options.num_speculative_tokens = f.speculative.num_tokens;
  if (Status s = kernels::SelectPathFromEnvironment(); !s.ok()) return Fail(s.ToString());
  PD_LOG_INFO("kernels: {}", kernels::DescribeSelection());
  auto make_engine = [&f](bool speculative) -> Result<std::unique_ptr<Engine>> {
    ModelFlags model = f.model;  // without speculation: the plain model, no MTP KV layer
    if (speculative) ApplySpeculativeToModel(f.speculative, &model);
    PD_ASSIGN_OR_RETURN(ModelDir dir, LoadFromFlags(model));
    EngineOptions engine_options = EngineOptionsFromFlags(model);
    std::unique_ptr<Drafter> drafter;
    if (speculative) {
      PD_ASSIGN_OR_RETURN(drafter,
                          MakeDrafterFromFlags(f.speculative, model, dir, &engine_options));
    }
    // The tokenizer is not needed (no stop strings, no text) and would not outlive the call.
    return Engine::Create(std::move(dir.transformer), nullptr, engine_options, std::move(drafter));
  };
  const Status status = bench::RunSpecBench(options, make_engine);
  if (!status.ok()) return Fail(status.ToString());
  return 0;
}

}  // namespace

void AddBenchSpecCommand(CLI::App& bench, int* exit_code) {
  auto flags = std::make_shared<BenchSpecFlags>();
  CLI::App* cmd = bench.add_subcommand(
      "spec", "Decode tokens/s with and without speculative decoding vs the expected speed-up");
  AddModelFlags(cmd, &flags->model);
  AddSpeculativeFlags(cmd, &flags->speculative);
  cmd->add_option("--batch", flags->batches, "Batch sizes, comma-separated")->capture_default_str();
  cmd->add_option("--prompt-len", flags->prompt_len, "Prompt tokens of each request")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--max-tokens", flags->max_tokens, "Tokens generated per request")
      ->check(CLI::Range(2, 1 << 20))
      ->capture_default_str();
  cmd->callback([flags, exit_code] { *exit_code = RunBenchSpec(*flags); });
}

}  // namespace pdserve::cli
