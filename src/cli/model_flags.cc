#include "cli/model_flags.h"

#include <cstdio>

namespace pdserve::cli {

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

Result<ModelDir> LoadFromFlags(const ModelFlags& flags) {
  ModelDirOptions options;
  options.weight_dtype = flags.dtype == "bf16"  ? WeightDType::kBF16
                         : flags.dtype == "f32" ? WeightDType::kF32
                                                : WeightDType::kAuto;
  options.transformer.threads = flags.threads;
  options.transformer.kv_type = flags.kv_dtype == "bf16"  ? TransformerOptions::KvType::kBF16
                                : flags.kv_dtype == "f32" ? TransformerOptions::KvType::kF32
                                                          : TransformerOptions::KvType::kAuto;
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
