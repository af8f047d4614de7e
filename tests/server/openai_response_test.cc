// Unit tests of response formatting (server/openai_response.h).
#include "server/openai_response.h"

#include <gtest/gtest.h>

namespace pdserve::server {
namespace {

using json = nlohmann::json;

ResponseContext Ctx(ApiKind kind) {
  ResponseContext c;
  c.kind = kind;
  c.id = kind == ApiKind::kChat ? "chatcmpl-1" : "cmpl-1";
  c.created = 42;
  c.model = "m";
  return c;
}

TEST(OpenAiResponseTest, CompletionBody) {
  GenerationResult r;
  r.text = "abc";
  r.token_ids = {1, 2};
  r.finish_reason = "length";
  r.prompt_tokens = 3;
  r.completion_tokens = 2;
  const json j = json::parse(FormatResponse(Ctx(ApiKind::kCompletion), r));
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], "abc");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_FALSE(j["choices"][0].contains("token_ids"));
  EXPECT_EQ(j["usage"]["total_tokens"], 5);
}

TEST(OpenAiResponseTest, ChatChunksAndInvalidUtf8) {
  ResponseContext ctx = Ctx(ApiKind::kChat);
  size_t offset = 0;
  ChunkContent role;
  role.role_chunk = true;
  json first = json::parse(FormatChunk(ctx, role, &offset));
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  ChunkContent text;
  text.text = "a\xff";  // a model may emit bytes that are not UTF-8: replaced, never thrown
  json mid = json::parse(FormatChunk(ctx, text, &offset));
  EXPECT_EQ(mid["choices"][0]["delta"]["content"], "a\xEF\xBF\xBD");
  EXPECT_TRUE(mid["choices"][0]["finish_reason"].is_null());
  ChunkContent fin;
  fin.finish_reason = "stop";
  json last = json::parse(FormatChunk(ctx, fin, &offset));
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  json usage = json::parse(FormatUsageChunk(ctx, 2, 3));
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 3);
}

}  // namespace
}  // namespace pdserve::server
