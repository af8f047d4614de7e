#include "server/openai_request.h"

#include <cmath>
#include <limits>
#include <optional>

#include <fmt/format.h>

namespace pdserve::server {
namespace {

// Ordered: messages and tools reach the chat template with the client's key order.
using json = nlohmann::ordered_json;
using http::ApiError;
using http::ApiResult;
using MaybeError = std::optional<ApiError>;

#define PD_RETURN_IF_API_ERROR(expr) \
  do {                               \
    if (MaybeError pd_e_ = (expr)) { \
      return *std::move(pd_e_);      \
    }                                \
  } while (0)

// Rejects bodies nested deeper than max_depth before parsing: nlohmann's value tree is
// recursive to destroy and to copy, so depth is bounded up front.
MaybeError CheckDepth(std::string_view body, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        return ApiError::InvalidRequest(fmt::format("JSON nested deeper than {} levels", max_depth),
                                        "", "invalid_json");
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return std::nullopt;
}

ApiResult<json> ParseObject(std::string_view body, const ParseLimits& limits) {
  PD_RETURN_IF_API_ERROR(CheckDepth(body, limits.max_json_depth));
  json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    return ApiError::InvalidRequest("request body is not valid JSON", "", "invalid_json");
  if (!j.is_object())
    return ApiError::InvalidRequest("request body must be a JSON object", "", "invalid_json");
  return j;
}

// The field's value, or null when it is absent or JSON null (OpenAI treats both as unset).
const json* Field(const json& obj, const char* name) {
  auto it = obj.find(name);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

ApiError TypeError(const char* name, const char* expected) {
  return ApiError::InvalidRequest(fmt::format("'{}' must be {}", name, expected), name,
                                  "invalid_type");
}

MaybeError ReadBool(const json& obj, const char* name, bool* out) {
  const json* v = Field(obj, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) return TypeError(name, "a boolean");
  *out = v->get<bool>();
  return std::nullopt;
}

MaybeError ReadString(const json& obj, const char* name, std::string* out) {
  const json* v = Field(obj, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) return TypeError(name, "a string");
  *out = v->get<std::string>();
  return std::nullopt;
}

MaybeError CheckIntValue(const json& v, const char* name, int64_t lo, int64_t hi, int64_t* out) {
  if (!v.is_number_integer()) return TypeError(name, "an integer");
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)) {
    return ApiError::InvalidRequest(fmt::format("'{}' must be in [{}, {}]", name, lo, hi), name);
  }
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) {
    return ApiError::InvalidRequest(
        fmt::format("'{}' must be in [{}, {}], got {}", name, lo, hi, x), name);
  }
  *out = x;
  return std::nullopt;
}

// Sets *out and *set when the field is present.
MaybeError ReadInt(const json& obj, const char* name, int64_t lo, int64_t hi, int64_t* out,
                   bool* set = nullptr) {
  const json* v = Field(obj, name);
  if (v == nullptr) return std::nullopt;
  PD_RETURN_IF_API_ERROR(CheckIntValue(*v, name, lo, hi, out));
  if (set != nullptr) *set = true;
  return std::nullopt;
}

MaybeError ReadFloat(const json& obj, const char* name, double lo, double hi, float* out) {
  const json* v = Field(obj, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) return TypeError(name, "a number");
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) {
    return ApiError::InvalidRequest(fmt::format("'{}' must be in [{}, {}]", name, lo, hi), name);
  }
  *out = static_cast<float>(x);
  return std::nullopt;
}

MaybeError ReadTokenIds(const json& arr, const char* name, const ParseLimits& limits,
                        std::vector<int32_t>* out) {
  const int64_t hi = limits.vocab_size > 0 ? limits.vocab_size - 1 : INT32_MAX;
  for (const json& t : arr) {
    int64_t id = 0;
    PD_RETURN_IF_API_ERROR(CheckIntValue(t, name, 0, hi, &id));
    out->push_back(static_cast<int32_t>(id));
  }
  return std::nullopt;
}

MaybeError ReadStop(const json& obj, const ParseLimits& limits, std::vector<std::string>* out) {
  const json* v = Field(obj, "stop");
  if (v == nullptr) return std::nullopt;
  if (v->is_string()) {
    if (!v->get_ref<const std::string&>().empty()) out->push_back(v->get<std::string>());
    return std::nullopt;
  }
  if (!v->is_array()) return TypeError("stop", "a string or a list of strings");
  if (static_cast<int>(v->size()) > limits.max_stop_strings) {
    return ApiError::InvalidRequest(
        fmt::format("'stop' holds more than {} strings", limits.max_stop_strings), "stop");
  }
  for (const json& s : *v) {
    if (!s.is_string()) return TypeError("stop", "a string or a list of strings");
    if (!s.get_ref<const std::string&>().empty()) out->push_back(s.get<std::string>());
  }
  return std::nullopt;
}

// Fields shared by both generation endpoints.
MaybeError ReadCommon(const json& j, const ParseLimits& limits, GenerationRequest* r) {
  PD_RETURN_IF_API_ERROR(ReadString(j, "model", &r->model));
  int64_t n = 1;
  PD_RETURN_IF_API_ERROR(ReadInt(j, "n", 1, 128, &n));
  if (n != 1)
    return ApiError::InvalidRequest("only 'n' = 1 is supported", "n", "unsupported_value");
  int64_t best_of = 1;
  PD_RETURN_IF_API_ERROR(ReadInt(j, "best_of", 1, 128, &best_of));
  if (best_of != 1) {
    return ApiError::InvalidRequest("only 'best_of' = 1 is supported", "best_of",
                                    "unsupported_value");
  }
  SamplingParams& p = r->params;
  int64_t max_tokens = 0;
  // max_completion_tokens (newer chat name) wins over max_tokens when both are given.
  PD_RETURN_IF_API_ERROR(ReadInt(j, "max_tokens", 1, INT32_MAX, &max_tokens, &r->max_tokens_set));
  PD_RETURN_IF_API_ERROR(
      ReadInt(j, "max_completion_tokens", 1, INT32_MAX, &max_tokens, &r->max_tokens_set));
  if (r->max_tokens_set) p.max_tokens = static_cast<int>(max_tokens);
  PD_RETURN_IF_API_ERROR(ReadFloat(j, "temperature", 0.0, 2.0, &p.temperature));
  PD_RETURN_IF_API_ERROR(ReadFloat(j, "top_p", 0.0, 1.0, &p.top_p));
  if (p.top_p <= 0.0f) return ApiError::InvalidRequest("'top_p' must be in (0, 1]", "top_p");
  int64_t top_k = 0;
  PD_RETURN_IF_API_ERROR(ReadInt(j, "top_k", -1, INT32_MAX, &top_k));
  p.top_k = static_cast<int>(top_k);
  bool seed_set = false;
  int64_t seed = 0;
  PD_RETURN_IF_API_ERROR(
      ReadInt(j, "seed", std::numeric_limits<int64_t>::min(), INT64_MAX, &seed, &seed_set));
  if (seed_set) p.seed = static_cast<uint64_t>(seed);
  PD_RETURN_IF_API_ERROR(ReadStop(j, limits, &p.stop));
  if (const json* ids = Field(j, "stop_token_ids")) {
    if (!ids->is_array()) return TypeError("stop_token_ids", "a list of token ids");
    PD_RETURN_IF_API_ERROR(ReadTokenIds(*ids, "stop_token_ids", limits, &p.stop_token_ids));
  }
  PD_RETURN_IF_API_ERROR(ReadBool(j, "ignore_eos", &p.ignore_eos));
  PD_RETURN_IF_API_ERROR(ReadBool(j, "stream", &r->stream));
  if (const json* so = Field(j, "stream_options")) {
    if (!so->is_object()) return TypeError("stream_options", "an object");
    PD_RETURN_IF_API_ERROR(ReadBool(*so, "include_usage", &r->include_usage));
  }
  PD_RETURN_IF_API_ERROR(ReadBool(j, "return_token_ids", &r->return_token_ids));
  return std::nullopt;
}

MaybeError ValidateParams(const GenerationRequest& r, const ParseLimits& limits) {
  Status s = r.params.Validate(limits.vocab_size > 0 ? limits.vocab_size : INT32_MAX);
  if (!s.ok()) return ApiError::InvalidRequest(s.message());
  return std::nullopt;
}

MaybeError ReadPrompt(const json& j, const ParseLimits& limits, GenerationRequest* r) {
  const json* p = Field(j, "prompt");
  if (p == nullptr)
    return ApiError::InvalidRequest("'prompt' is required", "prompt", "missing_required");
  if (p->is_string()) {
    r->prompt_text = p->get<std::string>();
    return std::nullopt;
  }
  const char* kExpected = "a string, a list of one string, or a list of token ids";
  if (!p->is_array() || p->empty()) return TypeError("prompt", kExpected);
  const json& first = (*p)[0];
  if (first.is_string() || first.is_array()) {
    // A batch: only one prompt per request is supported.
    if (p->size() != 1) {
      return ApiError::InvalidRequest("only one prompt per request is supported", "prompt",
                                      "unsupported_value");
    }
    if (first.is_string()) {
      r->prompt_text = first.get<std::string>();
      return std::nullopt;
    }
    if (first.empty()) return TypeError("prompt", kExpected);
    r->prompt_is_ids = true;
    return ReadTokenIds(first, "prompt", limits, &r->prompt_ids);
  }
  r->prompt_is_ids = true;
  return ReadTokenIds(*p, "prompt", limits, &r->prompt_ids);
}

// Normalises one message: content becomes a string (text parts joined).
MaybeError ReadMessage(const json& m, json* out) {
  if (!m.is_object()) return TypeError("messages", "a list of objects");
  const json* role = Field(m, "role");
  if (role == nullptr || !role->is_string()) return TypeError("messages[].role", "a string");
  const std::string& r = role->get_ref<const std::string&>();
  if (r != "system" && r != "user" && r != "assistant" && r != "tool" && r != "developer") {
    return ApiError::InvalidRequest(fmt::format("unknown message role '{}'", r), "messages[].role");
  }
  *out = m;
  const json* content = Field(m, "content");
  std::string text;
  if (content == nullptr) {
    if (r != "assistant")
      return ApiError::InvalidRequest("'messages[].content' is required", "messages");
  } else if (content->is_string()) {
    text = content->get<std::string>();
  } else if (content->is_array()) {
    for (const json& part : *content) {
      if (!part.is_object()) return TypeError("messages[].content[]", "an object");
      const json* type = Field(part, "type");
      if (type == nullptr || !type->is_string() || type->get<std::string>() != "text") {
        return ApiError::InvalidRequest("only content parts of type 'text' are supported",
                                        "messages[].content", "unsupported_value");
      }
      const json* t = Field(part, "text");
      if (t == nullptr || !t->is_string())
        return TypeError("messages[].content[].text", "a string");
      text += t->get<std::string>();
    }
  } else {
    return TypeError("messages[].content", "a string or a list of text parts");
  }
  (*out)["content"] = std::move(text);
  return std::nullopt;
}

MaybeError ReadMessages(const json& j, json* out) {
  const json* msgs = Field(j, "messages");
  if (msgs == nullptr)
    return ApiError::InvalidRequest("'messages' is required", "messages", "missing_required");
  if (!msgs->is_array()) return TypeError("messages", "a list of objects");
  if (msgs->empty()) return ApiError::InvalidRequest("'messages' must not be empty", "messages");
  *out = json::array();
  for (const json& m : *msgs) {
    json normalised;
    PD_RETURN_IF_API_ERROR(ReadMessage(m, &normalised));
    out->push_back(std::move(normalised));
  }
  return std::nullopt;
}

// What the chat template sees besides the messages, read the same way by /v1/chat/completions
// and /tokenize so both render the same prompt.
MaybeError ReadTemplateInputs(const json& j, json* tools, json* template_kwargs) {
  if (const json* t = Field(j, "tools")) {
    if (!t->is_array()) return TypeError("tools", "a list");
    *tools = *t;
  }
  if (const json* kw = Field(j, "chat_template_kwargs")) {
    if (!kw->is_object()) return TypeError("chat_template_kwargs", "an object");
    // The request's own fields and the tokenizer set these (transformers refuses them too).
    for (const char* reserved :
         {"messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token"}) {
      if (kw->contains(reserved)) {
        return ApiError::InvalidRequest(
            fmt::format("'chat_template_kwargs' must not set '{}'", reserved),
            "chat_template_kwargs");
      }
    }
    *template_kwargs = *kw;
  }
  return std::nullopt;
}

// Both endpoints answer "echo" and "suffix" clearly rather than silently doing something else.
MaybeError RejectUnsupported(const json& j) {
  bool echo = false;
  PD_RETURN_IF_API_ERROR(ReadBool(j, "echo", &echo));
  if (echo) return ApiError::InvalidRequest("'echo' is not supported", "echo", "unsupported_value");
  if (Field(j, "suffix") != nullptr) {
    return ApiError::InvalidRequest("'suffix' is not supported", "suffix", "unsupported_value");
  }
  // Constrained output is not implemented: accepting these would return free text where the
  // client relies on JSON or on a tool call.
  if (const json* format = Field(j, "response_format")) {
    if (!format->is_object()) return TypeError("response_format", "an object");
    const json* type = Field(*format, "type");
    if (type == nullptr || !type->is_string() || *type != "text") {
      return ApiError::InvalidRequest(
          "only 'response_format': {\"type\": \"text\"} is supported (no JSON mode or schema)",
          "response_format", "unsupported_value");
    }
  }
  if (const json* choice = Field(j, "tool_choice")) {
    if (!choice->is_string() || (*choice != "auto" && *choice != "none")) {
      return ApiError::InvalidRequest(
          "only 'tool_choice' \"auto\" or \"none\" is supported (tool calls cannot be forced)",
          "tool_choice", "unsupported_value");
    }
  }
  return std::nullopt;
}

}  // namespace

ApiResult<GenerationRequest> ParseCompletionRequest(std::string_view body,
                                                    const ParseLimits& limits) {
  ApiResult<json> parsed = ParseObject(body, limits);
  if (!parsed.ok()) return parsed.error();
  const json& j = parsed.value();
  GenerationRequest r;
  r.kind = ApiKind::kCompletion;
  PD_RETURN_IF_API_ERROR(RejectUnsupported(j));
  PD_RETURN_IF_API_ERROR(ReadPrompt(j, limits, &r));
  PD_RETURN_IF_API_ERROR(ReadCommon(j, limits, &r));
  // Completions: logprobs is the number of alternatives (0..20), null/absent = none.
  int64_t logprobs = -1;
  PD_RETURN_IF_API_ERROR(ReadInt(j, "logprobs", 0, SamplingParams::kMaxLogprobs, &logprobs));
  if (logprobs >= 0) {
    r.logprobs = true;
    r.params.logprobs = static_cast<int>(logprobs);
  }
  PD_RETURN_IF_API_ERROR(ValidateParams(r, limits));
  return r;
}

ApiResult<GenerationRequest> ParseChatRequest(std::string_view body, const ParseLimits& limits) {
  ApiResult<json> parsed = ParseObject(body, limits);
  if (!parsed.ok()) return parsed.error();
  const json& j = parsed.value();
  GenerationRequest r;
  r.kind = ApiKind::kChat;
  PD_RETURN_IF_API_ERROR(RejectUnsupported(j));
  PD_RETURN_IF_API_ERROR(ReadMessages(j, &r.messages));
  PD_RETURN_IF_API_ERROR(ReadCommon(j, limits, &r));
  // Chat: logprobs is a boolean, top_logprobs the number of alternatives.
  PD_RETURN_IF_API_ERROR(ReadBool(j, "logprobs", &r.logprobs));
  int64_t top = -1;
  PD_RETURN_IF_API_ERROR(ReadInt(j, "top_logprobs", 0, SamplingParams::kMaxLogprobs, &top));
  if (top >= 0 && !r.logprobs) {
    return ApiError::InvalidRequest("'top_logprobs' requires 'logprobs': true", "top_logprobs");
  }
  if (top > 0) r.params.logprobs = static_cast<int>(top);
  PD_RETURN_IF_API_ERROR(ReadTemplateInputs(j, &r.tools, &r.chat_template_kwargs));
  PD_RETURN_IF_API_ERROR(ReadBool(j, "add_generation_prompt", &r.add_generation_prompt));
  PD_RETURN_IF_API_ERROR(ValidateParams(r, limits));
  return r;
}

ApiResult<TokenizeRequest> ParseTokenizeRequest(std::string_view body, const ParseLimits& limits) {
  ApiResult<json> parsed = ParseObject(body, limits);
  if (!parsed.ok()) return parsed.error();
  const json& j = parsed.value();
  TokenizeRequest r;
  PD_RETURN_IF_API_ERROR(ReadString(j, "model", &r.model));
  bool add_special = true;
  if (Field(j, "add_special_tokens") != nullptr) {
    PD_RETURN_IF_API_ERROR(ReadBool(j, "add_special_tokens", &add_special));
    r.add_special_tokens = add_special;
  }
  PD_RETURN_IF_API_ERROR(ReadBool(j, "add_generation_prompt", &r.add_generation_prompt));
  if (Field(j, "messages") != nullptr) {
    r.is_chat = true;
    PD_RETURN_IF_API_ERROR(ReadMessages(j, &r.messages));
    PD_RETURN_IF_API_ERROR(ReadTemplateInputs(j, &r.tools, &r.chat_template_kwargs));
    return r;
  }
  if (Field(j, "prompt") == nullptr) {
    return ApiError::InvalidRequest("'prompt' or 'messages' is required", "prompt",
                                    "missing_required");
  }
  PD_RETURN_IF_API_ERROR(ReadString(j, "prompt", &r.prompt));
  return r;
}

ApiResult<std::vector<int32_t>> ParseDetokenizeRequest(std::string_view body,
                                                       const ParseLimits& limits) {
  ApiResult<json> parsed = ParseObject(body, limits);
  if (!parsed.ok()) return parsed.error();
  const json* tokens = Field(parsed.value(), "tokens");
  if (tokens == nullptr)
    return ApiError::InvalidRequest("'tokens' is required", "tokens", "missing_required");
  if (!tokens->is_array()) return TypeError("tokens", "a list of token ids");
  std::vector<int32_t> ids;
  PD_RETURN_IF_API_ERROR(ReadTokenIds(*tokens, "tokens", limits, &ids));
  return ids;
}

}  // namespace pdserve::server
