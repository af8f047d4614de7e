// The prompts `pdserve bench serve` sends, each with its token count and output length:
// - random: prompts of an exact number of tokens for the server's tokenizer, made of random
//   English words (so no two prompts share a prefix), lengths drawn uniformly from
//   [len * (1 - ratio), len * (1 + ratio)] as vllm's random dataset does;
// - jsonl: one JSON object per line, {"prompt": "...", "output_len": N} with an optional
//   "prompt_len": N (else counted with the tokenizer when one is given, else taken from the
//   server's usage report).
// Token counts come from a PromptTokenizer: pdserve's own tokenizer (--tokenizer DIR) or the
// server's /tokenize and /detokenize endpoints. Built once on the main thread before the run.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bench/serve_client.h"
#include "common/status.h"

namespace pdserve {
class Tokenizer;
}

namespace pdserve::bench {

struct SampleRequest {
  std::string prompt;
  int prompt_len = 0;  // tokens; 0 = unknown (the server's usage fills it in)
  int output_len = 0;
};

// Text <-> tokens as the server sees them (no special tokens added).
class PromptTokenizer {
 public:
  virtual ~PromptTokenizer() = default;
  virtual Result<std::vector<int32_t>> Encode(const std::string& text) = 0;
  virtual Result<std::string> Decode(const std::vector<int32_t>& ids) = 0;
};

// pdserve's tokenizer loaded from DIR.
Result<std::unique_ptr<PromptTokenizer>> LocalPromptTokenizer(const std::string& dir);
// The server's vLLM-style /tokenize ({"model","prompt","add_special_tokens":false} ->
// {"tokens"}) and /detokenize ({"model","tokens"} -> {"prompt"}).
std::unique_ptr<PromptTokenizer> RemotePromptTokenizer(ServerAddress server, std::string model);

struct RandomDatasetOptions {
  int num_prompts = 0;
  int input_len = 1024;
  int output_len = 128;
  double range_ratio = 0;  // in [0, 1)
  uint64_t seed = 0;
};

// Prompts of exactly the drawn token count where the tokenizer allows (re-encoding the
// decoded text may merge tokens differently; the count recorded is always the real one).
Result<std::vector<SampleRequest>> RandomDataset(const RandomDatasetOptions& options,
                                                 PromptTokenizer& tokenizer);

// The first `num_prompts` lines of `path` (cycled if the file has fewer); `tokenizer` may be
// null. InvalidArgument names the line that lacks a field or is not JSON.
Result<std::vector<SampleRequest>> JsonlDataset(const std::string& path, int num_prompts,
                                                PromptTokenizer* tokenizer);

}  // namespace pdserve::bench
