// `pdserve bench disagg`: what streaming the KV cache layer by layer buys for one long prompt
// (DESIGN.md §3.3). One process holds a real prefill node and a real decode node — two
// engines, each with its own KV messenger and fabric endpoint, joined over shm or tcp exactly
// as two `pdserve serve` processes are — so both event logs share one clock. Per run it
// measures, from the messengers' own event timestamps: P's prefill compute (first chunk
// scheduled -> last layer of the last chunk done), the transfer tail (that end -> D counted the
// last expected write), and the bytes and writes moved, with streaming on and with streaming off
// (every write posted after the last forward pass).
//
// Threads: RunDisaggBench from one thread; it starts and stops the engines, messengers and
// fabric threads it needs. Run nothing else meanwhile (the figures are timings).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/engine.h"
#include "model/config.h"
#include "model/model_dir.h"

namespace pdserve::bench {

struct DisaggBenchOptions {
  std::string model_dir;
  ModelDirOptions load;          // load.transformer.threads: P's compute threads (D gets 1)
  EngineOptions engine;          // both nodes (page size, cache size, P's chunk budget)
  int prompt_len = 2048;         // prompt tokens; P prefills the first prompt_len - 1
  int repeats = 3;               // runs per mode (medians reported)
  std::string provider = "shm";  // shm | tcp (tcp over 127.0.0.1)
  uint32_t seed = 1;             // of the random prompt
  int timeout_s = 600;           // bound of each run
};

// One request's figures. Seconds unless named otherwise.
struct DisaggRun {
  bool streaming = true;
  int steps = 0;            // P's forward passes for the prompt
  double compute_s = 0;     // first step scheduled -> last layer of the last step done
  double tail_s = 0;        // compute end -> D counted the last expected write
  double transfer_s = 0;    // P posted its first write -> D counted the last one
  double latency_s = 0;     // D sent the PrefillRequest -> D counted the last write
  int64_t writes_sent = 0;  // P: writes completed (stats delta)
  int64_t bytes_sent = 0;
  int64_t writes_received = 0;  // D: writes of the landed transfer (stats delta)
  int64_t bytes_received = 0;
};

// What a token's KV costs the model per layer, from its config: the values its cache holds, and
// those a plain (decompressed) K/V cache of the same model would hold. For an MLA model the
// cache is the latent, kv_lora_rank + qk_rope_head_dim values, and the plain cache is the
// multi-head one DeepSeek would need without it, num_heads x (qk_nope_head_dim +
// qk_rope_head_dim + v_head_dim); for a GQA model both are its K and V, 2 x num_kv_heads x
// head_dim.
struct KvValuesPerToken {
  int cached = 0;
  int plain = 0;
  bool latent = false;  // an MLA model
};
KvValuesPerToken KvValuesOf(const ModelConfig& config);

struct DisaggBenchResult {
  int prompt_len = 0;
  int num_layers = 0;
  int pages = 0;  // pages of the prefilled prefix
  int page_tokens = 0;
  uint64_t plan_writes = 0;  // what the transfer plan says for those pages
  uint64_t plan_bytes = 0;
  KvValuesPerToken kv;
  // What a plain K/V cache of the same model (kv.plain values a token and layer, the cache's
  // dtype) would move for the same whole pages: plan_bytes x kv.plain / kv.cached.
  uint64_t plain_kv_bytes = 0;
  std::vector<DisaggRun> runs;  // in the order run (on and off alternate)
};

// InvalidArgument for bad options (prompt_len < 2, beyond the model's context or the cache,
// repeats < 1, an unknown provider); errors of the model, engine, messenger or a run that
// does not finish in time pass through.
Result<DisaggBenchResult> RunDisaggBench(const DisaggBenchOptions& options);

// The plan's bytes per prefilled token beside a plain K/V cache's (and their ratio), then the
// markdown table: per figure, median [min, max] with streaming on and off.
std::string FormatDisaggTable(const DisaggBenchResult& result);

}  // namespace pdserve::bench
