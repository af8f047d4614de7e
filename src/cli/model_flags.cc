#include "cli/model_flags.h"

#include <cstdio>
#include <optional>
#include <string_view>

#include <fmt/format.h>

#include "common/dtype.h"

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

void AddModelFlags(CLI::App* cmd, ModelFlags* flags) {
  cmd->add_option("--model", flags->model, "Hugging Face model directory")->required();
  cmd->add_option("--threads", flags->threads, "Compute threads (0 = all cores)")
      ->check(CLI::Range(0, 1024));
  cmd->add_option("--dtype", flags->dtype, "Weight dtype")
      ->check(CLI::IsMember({"auto", "bf16", "f32"}))
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
}

Result<ModelDirOptions> LoadOptionsFromFlags(const ModelFlags& flags) {
  ModelDirOptions options;
  PD_ASSIGN_OR_RETURN(options.weight_dtype, ParseAutoDType("--dtype", flags.dtype));
  PD_ASSIGN_OR_RETURN(options.transformer.kv_dtype, ParseAutoDType("--kv-dtype", flags.kv_dtype));
  options.transformer.threads = flags.threads;
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
  return options;
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  return 1;
}

}  // namespace pdserve::cli
