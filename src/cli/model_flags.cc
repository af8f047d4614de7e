#include "cli/model_flags.h"

#include <cstdio>
#include <optional>
#include <string_view>

#include <fmt/format.h>

#include "common/dtype.h"
#include "engine/draft_model_drafter.h"
#include "kernels/dispatch.h"

namespace pdserve::cli {
namespace {

// "auto" is no type: the loader picks one (nullopt).
Result<std::optional<DType>> ParseAutoDType(std::string_view flag, const std::string& value) {
  if (value == "auto") return std::optional<DType>();
  std::optional<DType> t = ParseDTypeFlag(value);
  if (!t.has_value()) {
    return Status::InvalidArgument(
        fmt::format("{} {}: not a dtype (auto, bf16, f32)", flag, value));
  }
  return t;
}

}  // namespace

void AddModelFlags(CLI::App* cmd, ModelFlags* flags, bool tensor_parallel) {
  cmd->add_option("--model", flags->model, "Hugging Face model directory")->required();
  cmd->add_option("--threads", flags->threads, "Compute threads (0 = all cores)")
      ->check(CLI::Range(0, 1024));
  cmd->add_option("--dtype", flags->dtype, "Weight dtype")
      ->check(CLI::IsMember({"auto", "bf16", "f32"}))
      ->capture_default_str();
  cmd->add_option("--weights", flags->weights,
                  "Linear layers' weights in memory: the checkpoint's own (auto), bf16, or 8-bit "
                  "quantised at load (fp8: e4m3 with a scale per 128 x 128 block; int8: a scale "
                  "per row and 128 columns; the embedding stays bf16, the lm_head as --lm-head "
                  "says)")
      ->check(CLI::IsMember({"auto", "bf16", "fp8", "int8"}))
      ->capture_default_str();
  cmd->add_option("--lm-head", flags->lm_head,
                  "Output matrix (lm_head, or the tied embedding as the head) in memory: int8 "
                  "(a scale per vocabulary row and 128 columns, quantised at load; a tied "
                  "embedding keeps its own copy for the lookups), bf16 (as the other matrices), "
                  "or auto: int8 when the linear layers are 8-bit (--weights fp8|int8, or an "
                  "8-bit checkpoint), else bf16")
      ->check(CLI::IsMember({"auto", "bf16", "int8"}))
      ->capture_default_str();
  cmd->add_option("--kv-dtype", flags->kv_dtype, "KV cache dtype")
      ->check(CLI::IsMember({"auto", "bf16", "f32"}))
      ->capture_default_str();
  cmd->add_option("--page-size", flags->page_size, "Tokens per KV page")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_option("--kv-cache-mb", flags->kv_cache_mb, "KV cache size in MiB")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--max-batch-tokens", flags->max_batch_tokens, "Token budget per step")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--max-running", flags->max_running, "Sequences per step")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  cmd->add_flag(
      "--no-prefix-caching", flags->no_prefix_caching,
      "Turn off automatic prefix caching (on by default: a prompt's full KV pages that an "
      "earlier request computed are shared instead of computed again)");
  if (!tensor_parallel) return;
  cmd->add_option("--tp", flags->tp,
                  "Tensor-parallel ranks (rank 0 here, the others in `pdserve rank-worker` "
                  "processes; --threads is per rank)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--tp-timeout-s", flags->tp_timeout_s,
                  "With --tp > 1: seconds a rank may wait for another inside a forward pass "
                  "(a stopped or hung rank) before the node gives up on the ranks")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
}

void AddSpeculativeFlags(CLI::App* cmd, SpeculativeFlags* flags) {
  cmd->add_option("--speculative", flags->method,
                  "Speculative decoding: 'draft' (a draft model, --draft-model) or 'mtp' (the "
                  "model's own multi-token-prediction module, DeepSeek-V3/R1; on a prefill node: "
                  "write its KV for the decode nodes); greedy requests' output is unchanged")
      ->check(CLI::IsMember({"draft", "mtp"}));
  cmd->add_option("--draft-model", flags->draft_model,
                  "With --speculative draft: the draft model's directory (the target's "
                  "vocabulary and tokenizer)");
  cmd->add_option("--num-speculative-tokens", flags->num_tokens,
                  "With --speculative: tokens drafted per sequence and step")
      ->check(CLI::Range(1, EngineOptions::kMaxSpeculativeTokens))
      ->capture_default_str();
}

void ApplySpeculativeToModel(const SpeculativeFlags& flags, ModelFlags* model) {
  model->mtp_kv = flags.method == "mtp";
}

Result<std::unique_ptr<Drafter>> MakeDrafterFromFlags(const SpeculativeFlags& flags,
                                                      const ModelFlags& model,
                                                      const ModelDir& target,
                                                      EngineOptions* options) {
  if (flags.method.empty()) {
    if (!flags.draft_model.empty()) {
      return Status::InvalidArgument("--draft-model needs --speculative draft");
    }
    return std::unique_ptr<Drafter>();
  }
  if (flags.method == "mtp") {
    if (!flags.draft_model.empty()) {
      return Status::InvalidArgument("--draft-model is for --speculative draft, not mtp");
    }
    if (!target.transformer->mtp_kv()) {
      return Status::InvalidArgument("--speculative mtp: the model was loaded without --mtp-kv");
    }
    options->num_speculative_tokens = flags.num_tokens;
    return std::unique_ptr<Drafter>();
  }
  if (flags.draft_model.empty()) {
    return Status::InvalidArgument("--speculative draft needs --draft-model DIR");
  }
  PD_ASSIGN_OR_RETURN(ModelDirOptions load, LoadOptionsFromFlags(model));
  load.transformer.tp_size = 1;
  PD_ASSIGN_OR_RETURN(ModelDir draft, LoadModelDir(flags.draft_model, load));
  if (Status s = CheckDraftCompatible(target.config, target.tokenizer.get(), draft.config,
                                      draft.tokenizer.get());
      !s.ok()) {
    return s.WithContext("--draft-model " + flags.draft_model);
  }
  PD_ASSIGN_OR_RETURN(auto drafter,
                      DraftModelDrafter::Create(std::move(draft.transformer), target.config));
  options->num_speculative_tokens = flags.num_tokens;
  return std::unique_ptr<Drafter>(std::move(drafter));
}

Result<ModelDirOptions> LoadOptionsFromFlags(const ModelFlags& flags) {
  ModelDirOptions options;
  PD_ASSIGN_OR_RETURN(options.weight_dtype, ParseAutoDType("--dtype", flags.dtype));
  if (flags.weights != "auto") options.weight_format = ParseDTypeFlag(flags.weights);
  if (flags.lm_head != "auto") options.head_format = ParseDTypeFlag(flags.lm_head);
  PD_ASSIGN_OR_RETURN(options.transformer.kv_dtype, ParseAutoDType("--kv-dtype", flags.kv_dtype));
  options.transformer.threads = flags.threads;
  options.transformer.tp_size = flags.tp;
  options.transformer.mtp_kv = flags.mtp_kv;
  return options;
}

Result<ModelDir> LoadFromFlags(const ModelFlags& flags) {
  PD_ASSIGN_OR_RETURN(ModelDirOptions options, LoadOptionsFromFlags(flags));
  return LoadModelDir(flags.model, options);
}

EngineOptions EngineOptionsFromFlags(const ModelFlags& flags) {
  EngineOptions options;
  options.page_tokens = flags.page_size;
  options.kv_cache_bytes = static_cast<size_t>(flags.kv_cache_mb) << 20;
  options.scheduler.max_batch_tokens = flags.max_batch_tokens;
  options.scheduler.max_running = flags.max_running;
  options.prefix_caching = !flags.no_prefix_caching;
  options.tensor_parallel.size = flags.tp;
  options.tensor_parallel.collective_timeout = std::chrono::seconds(flags.tp_timeout_s);
  // Each worker loads the model as this process did, as its own rank, on the same kernel path.
  options.tensor_parallel.worker_env = {{"PDSERVE_KERNELS", std::string(kernels::ActivePath())}};
  options.tensor_parallel.worker_argv = [flags](int rank, int group_fd, int kv_fd) {
    std::vector<std::string> argv{"/proc/self/exe", "rank-worker",
                                  "--model",        flags.model,
                                  "--threads",      std::to_string(flags.threads),
                                  "--dtype",        flags.dtype,
                                  "--weights",      flags.weights,
                                  "--lm-head",      flags.lm_head,
                                  "--kv-dtype",     flags.kv_dtype,
                                  "--page-size",    std::to_string(flags.page_size),
                                  "--tp",           std::to_string(flags.tp),
                                  "--tp-timeout-s", std::to_string(flags.tp_timeout_s),
                                  "--tp-rank",      std::to_string(rank),
                                  "--group-fd",     std::to_string(group_fd),
                                  "--kv-fd",        std::to_string(kv_fd)};
    if (flags.mtp_kv) argv.push_back("--mtp-kv");
    return argv;
  };
  return options;
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  return 1;
}

}  // namespace pdserve::cli
