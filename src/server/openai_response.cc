#include "server/openai_response.h"

namespace pdserve::server {
namespace {

using json = nlohmann::json;

std::string TokenString(const ResponseContext& ctx, int32_t id) {
  return ctx.tokenizer != nullptr ? ctx.tokenizer->TokenBytes(id) : std::string();
}

json Bytes(const std::string& s) {
  json out = json::array();
  for (unsigned char c : s) out.push_back(static_cast<int>(c));
  return out;
}

// Completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}.
json CompletionLogprobs(const ResponseContext& ctx, const std::vector<SampleResult>& samples,
                        size_t* text_offset) {
  json tokens = json::array(), logprobs = json::array(), top = json::array(),
       offsets = json::array();
  for (const SampleResult& s : samples) {
    const std::string t = TokenString(ctx, s.token);
    tokens.push_back(t);
    logprobs.push_back(s.logprob);
    json alternatives = json::object();
    for (const TokenLogprob& a : s.top_logprobs) {
      alternatives[TokenString(ctx, a.token)] = a.logprob;
    }
    top.push_back(std::move(alternatives));
    offsets.push_back(*text_offset);
    *text_offset += t.size();
  }
  return {{"tokens", tokens},
          {"token_logprobs", logprobs},
          {"top_logprobs", top},
          {"text_offset", offsets}};
}

// Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}.
json ChatLogprobs(const ResponseContext& ctx, const std::vector<SampleResult>& samples) {
  json content = json::array();
  for (const SampleResult& s : samples) {
    const std::string t = TokenString(ctx, s.token);
    json top = json::array();
    for (const TokenLogprob& a : s.top_logprobs) {
      const std::string at = TokenString(ctx, a.token);
      top.push_back({{"token", at}, {"logprob", a.logprob}, {"bytes", Bytes(at)}});
    }
    content.push_back(
        {{"token", t}, {"logprob", s.logprob}, {"bytes", Bytes(t)}, {"top_logprobs", top}});
  }
  return {{"content", content}};
}

json Logprobs(const ResponseContext& ctx, const std::vector<SampleResult>& samples,
              size_t* text_offset) {
  if (!ctx.logprobs) return nullptr;
  return ctx.kind == ApiKind::kChat ? ChatLogprobs(ctx, samples)
                                    : CompletionLogprobs(ctx, samples, text_offset);
}

json Usage(int prompt_tokens, int completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

json Envelope(const ResponseContext& ctx, bool chunk) {
  const char* object = ctx.kind == ApiKind::kChat
                           ? (chunk ? "chat.completion.chunk" : "chat.completion")
                           : "text_completion";
  return {{"id", ctx.id},
          {"object", object},
          {"created", ctx.created},
          {"model", ctx.model},
          {"system_fingerprint", nullptr}};
}

json FinishReason(const std::string& reason) {
  return reason.empty() ? json(nullptr) : json(reason);
}

}  // namespace

std::string DumpJson(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string FormatResponse(const ResponseContext& ctx, const GenerationResult& result) {
  json j = Envelope(ctx, /*chunk=*/false);
  size_t offset = 0;
  json choice = {{"index", 0},
                 {"logprobs", Logprobs(ctx, result.samples, &offset)},
                 {"finish_reason", FinishReason(result.finish_reason)}};
  if (ctx.kind == ApiKind::kChat) {
    choice["message"] = {{"role", "assistant"}, {"content", result.text}};
  } else {
    choice["text"] = result.text;
  }
  if (ctx.return_token_ids) {
    choice["prompt_token_ids"] = ctx.prompt_ids;
    choice["token_ids"] = result.token_ids;
  }
  j["choices"] = json::array({std::move(choice)});
  j["usage"] = Usage(result.prompt_tokens, result.completion_tokens);
  return DumpJson(j);
}

std::string FormatChunk(const ResponseContext& ctx, const ChunkContent& content,
                        size_t* text_offset) {
  json j = Envelope(ctx, /*chunk=*/true);
  json choice = {{"index", 0},
                 {"logprobs", Logprobs(ctx, content.samples, text_offset)},
                 {"finish_reason", FinishReason(content.finish_reason)}};
  if (ctx.kind == ApiKind::kChat) {
    if (content.role_chunk) {
      choice["delta"] = {{"role", "assistant"}, {"content", ""}};
    } else if (!content.text.empty() || content.finish_reason.empty()) {
      choice["delta"] = {{"content", content.text}};
    } else {
      choice["delta"] = json::object();
    }
  } else {
    choice["text"] = content.text;
  }
  if (ctx.return_token_ids) {
    if (content.role_chunk) choice["prompt_token_ids"] = ctx.prompt_ids;
    choice["token_ids"] = content.token_ids;
  }
  j["choices"] = json::array({std::move(choice)});
  if (content.usage_null) j["usage"] = nullptr;
  return DumpJson(j);
}

std::string FormatUsageChunk(const ResponseContext& ctx, int prompt_tokens, int completion_tokens) {
  json j = Envelope(ctx, /*chunk=*/true);
  j["choices"] = json::array();
  j["usage"] = Usage(prompt_tokens, completion_tokens);
  return DumpJson(j);
}

}  // namespace pdserve::server
