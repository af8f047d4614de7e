// Flags shared by every subcommand that loads a model and runs an engine, and the helpers
// that turn them into options. Used from main() only (single-threaded).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "common/status.h"
#include "engine/engine.h"
#include "model/model_dir.h"

namespace pdserve::cli {

struct ModelFlags {
  std::string model;
  int threads = 0;
  std::string dtype = "auto";  // weights: auto|bf16|f32
  // The linear layers' weights in memory: auto (the checkpoint's own)|bf16|fp8|int8.
  std::string weights = "auto";
  // The output matrix (lm_head or tied embedding) in memory: auto (int8 when the linear layers
  // are 8-bit)|bf16 (as the other matrices)|int8.
  std::string lm_head = "auto";
  std::string kv_dtype = "auto";  // auto|bf16|f32
  int page_size = 16;
  int kv_cache_mb = 256;
  int max_batch_tokens = 512;
  int max_running = 64;
  bool no_prefix_caching = false;  // --no-prefix-caching (engine/prefix_cache.h)
  int tp = 1;  // tensor-parallel ranks: this process is rank 0, the others `rank-worker`s
  // Longest wait of a rank for another inside a forward pass before the group fails.
  int tp_timeout_s = 120;
  // The cache gets the MTP module's KV layer (TransformerOptions::mtp_kv): set by
  // `--speculative mtp` (ApplySpeculativeToModel), passed on to rank workers as --mtp-kv.
  bool mtp_kv = false;
};

// Speculative decoding (--speculative draft --draft-model DIR, or --speculative mtp;
// --num-speculative-tokens K).
struct SpeculativeFlags {
  std::string method;  // "" (off), "draft" or "mtp"
  std::string draft_model;
  int num_tokens = 3;
};
void AddSpeculativeFlags(CLI::App* cmd, SpeculativeFlags* flags);
// What speculation asks of the target's loading, before LoadFromFlags: MTP's KV layer.
void ApplySpeculativeToModel(const SpeculativeFlags& flags, ModelFlags* model);
// The drafter the flags ask for, null when they ask for none or for MTP (the engine then
// drafts with the model's own module); checks the draft model against `target` (config and
// tokenizer: engine/draft_model_drafter.h). Sets options->num_speculative_tokens. The draft model
// loads as `model` says (dtype, threads) on one rank.
Result<std::unique_ptr<Drafter>> MakeDrafterFromFlags(const SpeculativeFlags& flags,
                                                      const ModelFlags& model,
                                                      const ModelDir& target,
                                                      EngineOptions* options);

// `tensor_parallel`: also --tp and --tp-timeout-s, for the commands that run an Engine
// (generate, serve) and for rank-worker; the benchmarks that drive one rank's Transformer or
// plan TP-1 transfers themselves do not offer them.
void AddModelFlags(CLI::App* cmd, ModelFlags* flags, bool tensor_parallel = false);
Result<ModelDir> LoadFromFlags(const ModelFlags& flags);
// What LoadFromFlags passes to LoadModelDir (for commands that load the model themselves).
Result<ModelDirOptions> LoadOptionsFromFlags(const ModelFlags& flags);
EngineOptions EngineOptionsFromFlags(const ModelFlags& flags);

// Prints "error: message" to stderr and returns exit code 1.
int Fail(const std::string& message);

}  // namespace pdserve::cli

// Like PD_ASSIGN_OR_RETURN, for CLI functions that return an exit code.
#define PD_ASSIGN_OR_RETURN_CLI(lhs, expr) \
  PD_ASSIGN_OR_RETURN_CLI_IMPL(PD_STATUS_CONCAT(pd_cli_result_, __LINE__), lhs, expr)
#define PD_ASSIGN_OR_RETURN_CLI_IMPL(tmp, lhs, expr)                   \
  auto tmp = (expr);                                                   \
  if (!tmp.ok()) return ::pdserve::cli::Fail(tmp.status().ToString()); \
  lhs = std::move(tmp).value()
