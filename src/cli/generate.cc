// `pdserve generate`: one prompt through the engine, the completion streamed to stdout.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/model_flags.h"
#include "common/logging.h"
#include "engine/engine.h"
#include "kernels/dispatch.h"

namespace pdserve::cli {
namespace {

struct GenerateFlags {
  ModelFlags model;
  SpeculativeFlags speculative;
  std::string prompt;
  std::string prompt_ids;  // JSON array, instead of --prompt
  SamplingParams params;
  uint64_t seed = 0;
  bool has_seed = false;
  bool json = false;
};

int RunGenerate(GenerateFlags& f) {
  // Before any kernel runs: a path this CPU lacks is an error here, not a SIGILL later.
  if (Status s = kernels::SelectPathFromEnvironment(); !s.ok()) return Fail(s.ToString());
  PD_LOG_INFO("kernels: {}", kernels::DescribeSelection());
  ApplySpeculativeToModel(f.speculative, &f.model);
  PD_ASSIGN_OR_RETURN_CLI(ModelDir dir, LoadFromFlags(f.model));
  std::vector<int32_t> prompt;
  if (!f.prompt_ids.empty()) {
    auto parsed = nlohmann::json::parse(f.prompt_ids, nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_array()) return Fail("--prompt-ids must be a JSON array of token ids");
    for (const auto& v : parsed) {
      if (!v.is_number_integer()) return Fail("--prompt-ids must hold integers only");
      prompt.push_back(v.get<int32_t>());
    }
  } else {
    prompt = dir.tokenizer->Encode(f.prompt, /*add_special=*/true);
  }
  if (f.has_seed) f.params.seed = f.seed;

  EngineOptions options = EngineOptionsFromFlags(f.model);
  PD_ASSIGN_OR_RETURN_CLI(std::unique_ptr<Drafter> drafter,
                          MakeDrafterFromFlags(f.speculative, f.model, dir, &options));
  PD_ASSIGN_OR_RETURN_CLI(
      auto engine,
      Engine::Create(std::move(dir.transformer), dir.tokenizer.get(), options, std::move(drafter)));
  std::vector<int32_t> generated;
  std::string text;
  RequestOutput last;
  const auto start = std::chrono::steady_clock::now();
  auto first_token = start;
  EngineRequest request;
  request.id = "generate-0";
  request.prompt = prompt;
  request.params = f.params;
  request.on_output = [&](const RequestOutput& out) {
    if (generated.empty() && !out.tokens.empty()) first_token = std::chrono::steady_clock::now();
    generated.insert(generated.end(), out.tokens.begin(), out.tokens.end());
    text += out.text;
    if (!f.json) {
      std::fwrite(out.text.data(), 1, out.text.size(), stdout);
      std::fflush(stdout);
    }
    if (out.finished) last = out;
  };
  if (Status s = engine->Submit(std::move(request)); !s.ok()) return Fail(s.ToString());
  engine->RunUntilIdle();
  const auto end = std::chrono::steady_clock::now();
  if (last.finish_reason == FinishReason::kError) return Fail(last.status.ToString());

  const double prefill_s = std::chrono::duration<double>(first_token - start).count();
  const double decode_s = std::chrono::duration<double>(end - first_token).count();
  if (f.json) {
    nlohmann::json j = {{"prompt_ids", prompt},
                        {"token_ids", generated},
                        {"text", text},
                        {"finish_reason", FinishReasonName(last.finish_reason)}};
    std::cout << j.dump() << "\n";
  } else {
    std::cout << "\n";
  }
  std::fprintf(stderr,
               "[pdserve] prompt %zu tokens in %.3f s (%.1f tok/s); generated %zu tokens, "
               "%.1f tok/s decode; finish: %s\n",
               prompt.size(), prefill_s, prompt.size() / std::max(prefill_s, 1e-9),
               generated.size(),
               generated.size() > 1 ? (generated.size() - 1) / std::max(decode_s, 1e-9) : 0.0,
               FinishReasonName(last.finish_reason));
  return 0;
}

}  // namespace

void AddGenerateCommand(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<GenerateFlags>();
  flags->params.temperature = 0.0f;
  flags->params.max_tokens = 64;
  CLI::App* cmd = app.add_subcommand("generate", "Generate a completion for one prompt");
  AddModelFlags(cmd, &flags->model, /*tensor_parallel=*/true);
  AddSpeculativeFlags(cmd, &flags->speculative);
  auto* prompt = cmd->add_option("--prompt", flags->prompt, "Prompt text");
  auto* ids = cmd->add_option("--prompt-ids", flags->prompt_ids,
                              "Prompt as a JSON array of token ids (instead of --prompt)");
  prompt->excludes(ids);
  cmd->add_option("--max-tokens", flags->params.max_tokens, "Tokens to generate")
      ->capture_default_str();
  cmd->add_option("--temperature", flags->params.temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-p", flags->params.top_p, "Nucleus sampling mass")->capture_default_str();
  cmd->add_option("--top-k", flags->params.top_k, "Keep the k most likely tokens (0 = off)")
      ->capture_default_str();
  cmd->add_option_function<uint64_t>(
      "--seed",
      [flags](uint64_t s) {
        flags->seed = s;
        flags->has_seed = true;
      },
      "Sampling seed");
  cmd->add_option("--stop", flags->params.stop, "Stop string (repeatable)");
  cmd->add_flag("--ignore-eos", flags->params.ignore_eos, "Keep generating past EOS");
  cmd->add_flag("--json", flags->json, "Print one JSON object with the prompt and output ids");
  cmd->callback([flags, exit_code] { *exit_code = RunGenerate(*flags); });
}

}  // namespace pdserve::cli
