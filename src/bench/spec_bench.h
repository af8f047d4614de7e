// `pdserve bench spec`: decode throughput with and without speculative decoding, against the
// speed-up the measured acceptance and step costs predict. Runs on the caller's thread.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "common/status.h"
#include "engine/engine.h"

namespace pdserve::bench {

struct SpecBenchOptions {
  std::vector<int> batches = {1, 8};
  int prompt_len = 64;
  int max_tokens = 128;  // generated per request (greedy, EOS ignored)
  int num_speculative_tokens = 3;
  uint64_t seed = 1;  // of the random prompts
};

// make_engine(speculative) builds a fresh engine over the target, with the drafter when asked.
// Prints one table row per batch size to stdout.
Status RunSpecBench(const SpecBenchOptions& options,
                    const std::function<Result<std::unique_ptr<Engine>>(bool)>& make_engine);

}  // namespace pdserve::bench
