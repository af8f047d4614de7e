// Parsing and validation of OpenAI-style request bodies (/v1/completions,
// /v1/chat/completions, /tokenize, /detokenize): JSON text in, a typed request or an ApiError
// in the OpenAI shape out. Pure functions with no HTTP or model dependency (the fuzz target
// links only this, api_error and common); safe from any thread. Never throws.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/sampling_params.h"
#include "http/api_error.h"

namespace pdserve::server {

// What parsing needs to know about the served model.
struct ParseLimits {
  int vocab_size = 0;  // token ids must lie in [0, vocab_size); 0 = unchecked
  int max_stop_strings = 16;
  int max_json_depth = 64;  // deeper bodies are rejected before they reach the JSON parser
};

enum class ApiKind : uint8_t { kCompletion, kChat };

struct GenerationRequest {
  ApiKind kind = ApiKind::kCompletion;
  std::string model;  // empty: the served model
  // Completions: either text (prompt_is_ids false) or token ids.
  bool prompt_is_ids = false;
  std::string prompt_text;
  std::vector<int32_t> prompt_ids;
  // Chat: [{"role": string, "content": string, ...}] with text parts joined into one string.
  // Ordered JSON: object keys keep the client's order, as the template's tojson must print
  // them (Python keeps insertion order).
  nlohmann::ordered_json messages;
  nlohmann::ordered_json tools;  // chat: passed to the template as-is (null when absent)
  // chat: extra template variables (vLLM's extension, e.g. {"enable_thinking": false}), an
  // object or null.
  nlohmann::ordered_json chat_template_kwargs;
  bool add_generation_prompt = true;
  SamplingParams params;        // max_tokens, temperature, top_p, top_k, seed, stop, logprobs...
  bool max_tokens_set = false;  // false: completions default 16, chat fills the context
  bool stream = false;
  bool include_usage = false;     // stream_options.include_usage
  bool logprobs = false;          // return logprobs (completions: logprobs >= 0; chat: logprobs)
  bool return_token_ids = false;  // vLLM extension: prompt_token_ids/token_ids in choices
};

// /tokenize: {"prompt": string} or {"messages": [...]}; with messages, also the chat
// endpoint's tools and chat_template_kwargs, read the same way, so both render one prompt.
struct TokenizeRequest {
  std::string model;
  bool is_chat = false;
  std::string prompt;
  nlohmann::ordered_json messages;
  nlohmann::ordered_json tools;
  nlohmann::ordered_json chat_template_kwargs;
  // Unset: true for a prompt; for messages, what the chat prompt renderer says.
  std::optional<bool> add_special_tokens;
  bool add_generation_prompt = true;
};

http::ApiResult<GenerationRequest> ParseCompletionRequest(std::string_view body,
                                                          const ParseLimits& limits);
http::ApiResult<GenerationRequest> ParseChatRequest(std::string_view body,
                                                    const ParseLimits& limits);
http::ApiResult<TokenizeRequest> ParseTokenizeRequest(std::string_view body,
                                                      const ParseLimits& limits);
// /detokenize: {"tokens": [int...]} -> the ids.
http::ApiResult<std::vector<int32_t>> ParseDetokenizeRequest(std::string_view body,
                                                             const ParseLimits& limits);

}  // namespace pdserve::server
