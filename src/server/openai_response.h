// Formatting of OpenAI-shaped responses: the whole body of a non-streamed completion or chat
// completion, and the JSON of each chunk of a streamed one (framed by http/sse.h). Pure functions;
// safe from any thread. Text is dumped with invalid UTF-8 replaced, so no client or model byte can
// make them throw.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/sampler.h"
#include "server/openai_request.h"
#include "tokenizer/tokenizer.h"

namespace pdserve::server {

struct ResponseContext {
  ApiKind kind = ApiKind::kCompletion;
  std::string id;  // "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;
  std::string model;
  const Tokenizer* tokenizer = nullptr;  // for logprob token strings
  bool logprobs = false;
  bool return_token_ids = false;
  std::vector<int32_t> prompt_ids;  // echoed as prompt_token_ids with return_token_ids
};

struct GenerationResult {
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<SampleResult> samples;
  std::string finish_reason;  // "stop" or "length"
  int prompt_tokens = 0;
  int completion_tokens = 0;
};

// The JSON body of a non-streamed response.
std::string FormatResponse(const ResponseContext& ctx, const GenerationResult& result);

// One stream chunk holding new text (and its tokens); finish_reason empty = null. For chat,
// role_chunk makes the opening chunk (delta {"role": "assistant", "content": ""}).
// text_offset: completions logprobs' running offset of the chunk's first token (updated).
struct ChunkContent {
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<SampleResult> samples;
  std::string finish_reason;
  bool role_chunk = false;
  bool usage_null = false;  // stream_options.include_usage: every chunk carries "usage": null
};
std::string FormatChunk(const ResponseContext& ctx, const ChunkContent& content,
                        size_t* text_offset);
// The final chunk of stream_options.include_usage: empty choices and the usage.
std::string FormatUsageChunk(const ResponseContext& ctx, int prompt_tokens, int completion_tokens);

// Dumps j compactly with invalid UTF-8 replaced by U+FFFD.
std::string DumpJson(const nlohmann::json& j);

}  // namespace pdserve::server
