// `pdserve bench engine`: prefill and decode throughput of the forward pass, each beside the
// ceiling measured in the same run (oneDNN bf16 GEMM rate for prefill; memory bandwidth over
// the bytes a step reads, weights and K/V, for decode at each context) and the ratio to it,
// printed as a markdown table.
// Runs on the calling thread plus the model's and the probes' OpenMP teams; run nothing else
// meanwhile (the ceilings and the engine would measure each other).
#pragma once

#include <vector>

#include "common/status.h"
#include "model/model_dir.h"

namespace pdserve::bench {

// The decode contexts of every run unless the caller names others: a decode node's steady
// work is batches at long context, so those rows are never left out.
inline constexpr int kDefaultDecodeContexts[] = {256, 1024, 2048, 4096};

struct EngineBenchOptions {
  std::vector<int> batches = {1, 8, 32};  // decode batch sizes, each > 0
  // Decode rows: each batch at each context (tokens already in every sequence). Empty: the
  // kDefaultDecodeContexts that fit the model's context (the others are named as skipped).
  std::vector<int> contexts;
  int prompt_len = 512;  // prefill size
  int decode_steps = 8;  // at least this many timed steps per round
  int repeats = 3;       // rounds per figure (medians reported)
  int threads = 0;       // OpenMP threads of the ceilings (<= 0: default)
  int page_tokens = 16;  // KV page size of the cache the bench builds
};

// Benchmarks the model loaded in `dir` and prints the table to stdout. InvalidArgument on bad
// options (empty or non-positive batches, non-positive contexts, a prompt or context beyond the
// model's); errors of the model, the KV cache allocation or the probes pass through.
Status RunEngineBench(ModelDir& dir, const EngineBenchOptions& options);

}  // namespace pdserve::bench
