// The prompts `pdserve bench serve` sends, each with its token count and output length:
// - random: prompts of an exact number of tokens for the server's tokenizer, made of random
//   English words (so no two prompts share a prefix), lengths drawn uniformly from
//   [len * (1 - ratio), len * (1 + ratio)] as vllm's random dataset does;
// - shared-prefix: N prompts, each one of --num-prefixes shared prefixes of exactly L tokens
//   followed by a suffix of its own of exactly S tokens (vLLM's prefix_repetition dataset,
//   SGLang's generated-shared-prefix);
// - multi-turn: C conversations of T turns replayed from a fixed synthetic transcript: one
//   system prompt shared by every conversation; turn 1's prompt is the system prompt and a
//   user message, turn k+1's is turn k's prompt, an assistant answer and a new user message,
//   each part of an exact token count. The answers are the transcript's, not the server's, so
//   a turn's prompt never depends on what the server generated; RunServeBench sends a
//   conversation's turns in order, each once its predecessor has finished;
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
  // Multi-turn: the conversation (0-based) and the turn in it (1-based); requests of one
  // conversation are consecutive in the dataset, in turn order. -1 and 0 otherwise.
  int conversation = -1;
  int turn = 0;
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

struct SharedPrefixDatasetOptions {
  int num_prompts = 0;
  int prefix_len = 256;  // tokens of each shared prefix
  int suffix_len = 256;  // tokens of each prompt's own suffix
  int num_prefixes = 1;  // prompt i uses prefix i % num_prefixes
  int output_len = 128;
  uint64_t seed = 0;
};

// Every prompt has exactly prefix_len + suffix_len tokens and its first prefix_len tokens are
// its prefix's, exactly (InvalidArgument when the tokenizer does not allow it).
Result<std::vector<SampleRequest>> SharedPrefixDataset(const SharedPrefixDatasetOptions& options,
                                                       PromptTokenizer& tokenizer);

struct MultiTurnDatasetOptions {
  int num_conversations = 8;
  int num_turns = 4;
  int system_prompt_len = 512;  // tokens, shared by every conversation
  int user_len = 64;            // tokens of each user message
  int answer_len = 64;          // tokens of each replayed assistant answer
  int output_len = 32;          // tokens asked of the server per turn
  uint64_t seed = 0;
};

// Conversation c's turns are requests c*T .. c*T+T-1. Turn k's prompt has exactly
// system_prompt_len + k*user_len + (k-1)*answer_len tokens and starts with turn k-1's tokens.
Result<std::vector<SampleRequest>> MultiTurnDataset(const MultiTurnDatasetOptions& options,
                                                    PromptTokenizer& tokenizer);

// The first `num_prompts` lines of `path` (cycled if the file has fewer); `tokenizer` may be
// null. InvalidArgument names the line that lacks a field or is not JSON.
Result<std::vector<SampleRequest>> JsonlDataset(const std::string& path, int num_prompts,
                                                PromptTokenizer* tokenizer);

}  // namespace pdserve::bench
