// Unit tests of request parsing and validation (server/openai_request.h): no HTTP, no model.
#include "server/openai_request.h"

#include <gtest/gtest.h>

namespace pdserve::server {
namespace {

ParseLimits Limits() {
  ParseLimits l;
  l.vocab_size = 512;
  return l;
}

TEST(OpenAiRequestTest, CompletionFieldsMapToSamplingParams) {
  auto r = ParseCompletionRequest(
      R"({"model": "m", "prompt": "hi", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9,
          "top_k": 40, "seed": -3, "stop": ["a", "b"], "stream": true,
          "stream_options": {"include_usage": true}, "logprobs": 2, "unknown_field": {"x": 1}})",
      Limits());
  ASSERT_TRUE(r.ok()) << r.error().message;
  const GenerationRequest& g = r.value();
  EXPECT_EQ(g.model, "m");
  EXPECT_EQ(g.prompt_text, "hi");
  EXPECT_FALSE(g.prompt_is_ids);
  EXPECT_EQ(g.params.max_tokens, 7);
  EXPECT_TRUE(g.max_tokens_set);
  EXPECT_FLOAT_EQ(g.params.temperature, 0.5f);
  EXPECT_FLOAT_EQ(g.params.top_p, 0.9f);
  EXPECT_EQ(g.params.top_k, 40);
  ASSERT_TRUE(g.params.seed.has_value());
  EXPECT_EQ(*g.params.seed, static_cast<uint64_t>(int64_t{-3}));
  EXPECT_EQ(g.params.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(g.stream);
  EXPECT_TRUE(g.include_usage);
  EXPECT_TRUE(g.logprobs);
  EXPECT_EQ(g.params.logprobs, 2);
}

TEST(OpenAiRequestTest, PromptForms) {
  auto ids = ParseCompletionRequest(R"({"prompt": [1, 2, 3]})", Limits());
  ASSERT_TRUE(ids.ok());
  EXPECT_TRUE(ids.value().prompt_is_ids);
  EXPECT_EQ(ids.value().prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  auto nested = ParseCompletionRequest(R"({"prompt": [[4, 5]]})", Limits());
  ASSERT_TRUE(nested.ok());
  EXPECT_EQ(nested.value().prompt_ids, (std::vector<int32_t>{4, 5}));
  auto one = ParseCompletionRequest(R"({"prompt": ["text"], "stop": "x"})", Limits());
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one.value().prompt_text, "text");
  EXPECT_EQ(one.value().params.stop, (std::vector<std::string>{"x"}));
  EXPECT_FALSE(one.value().max_tokens_set);
}

TEST(OpenAiRequestTest, NullMeansUnset) {
  auto r = ParseCompletionRequest(
      R"({"prompt": "a", "max_tokens": null, "temperature": null, "stop": null, "n": null})",
      Limits());
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_FALSE(r.value().max_tokens_set);
  EXPECT_FLOAT_EQ(r.value().params.temperature, 1.0f);
}

TEST(OpenAiRequestTest, ChatNormalisesContentParts) {
  auto r = ParseChatRequest(
      R"({"messages": [{"role": "system", "content": "s"},
                       {"role": "user", "content": [{"type": "text", "text": "a"},
                                                    {"type": "text", "text": "b"}]},
                       {"role": "assistant", "content": null}],
          "max_completion_tokens": 3, "logprobs": true, "top_logprobs": 4})",
      Limits());
  ASSERT_TRUE(r.ok()) << r.error().message;
  const GenerationRequest& g = r.value();
  EXPECT_EQ(g.kind, ApiKind::kChat);
  ASSERT_EQ(g.messages.size(), 3u);
  EXPECT_EQ(g.messages[1]["content"], "ab");
  EXPECT_EQ(g.messages[2]["content"], "");
  EXPECT_EQ(g.params.max_tokens, 3);
  EXPECT_TRUE(g.logprobs);
  EXPECT_EQ(g.params.logprobs, 4);
}

TEST(OpenAiRequestTest, ErrorsNameTheField) {
  auto r = ParseCompletionRequest(R"({"prompt": "a", "temperature": "hot"})", Limits());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().http_status, 400);
  EXPECT_EQ(r.error().param, "temperature");
  EXPECT_NE(r.error().message.find("temperature"), std::string::npos);
  auto big =
      ParseCompletionRequest(R"({"prompt": "a", "max_tokens": 18446744073709551615})", Limits());
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.error().param, "max_tokens");
  auto stop_ids = ParseCompletionRequest(R"({"prompt": "a", "stop_token_ids": [600]})", Limits());
  ASSERT_FALSE(stop_ids.ok());
  auto utf8 = ParseCompletionRequest("{\"prompt\": \"\xff\xfe\"}", Limits());
  EXPECT_FALSE(utf8.ok());  // invalid UTF-8 in JSON text is malformed JSON
  EXPECT_NE(utf8.error().ToJson().find("invalid_json"), std::string::npos);
}

// Constrained output is refused until implemented, never silently ignored.
TEST(OpenAiRequestTest, ResponseFormatAndToolChoiceOnlyWhatIsSupported) {
  const std::string messages = R"("messages": [{"role": "user", "content": "x"}])";
  for (const char* ok : {R"("response_format": {"type": "text"})", R"("tool_choice": "auto")",
                         R"("tool_choice": "none")", R"("response_format": null)"}) {
    auto r = ParseChatRequest("{" + messages + ", " + ok + "}", Limits());
    EXPECT_TRUE(r.ok()) << ok << ": " << (r.ok() ? "" : r.error().message);
  }
  for (const char* refused :
       {R"("response_format": {"type": "json_schema", "json_schema": {}})",
        R"("response_format": {"type": "json_object"})", R"("tool_choice": "required")",
        R"("tool_choice": {"type": "function", "function": {"name": "f"}})"}) {
    auto r = ParseChatRequest("{" + messages + ", " + refused + "}", Limits());
    ASSERT_FALSE(r.ok()) << refused;
    EXPECT_EQ(r.error().http_status, 400);
    EXPECT_EQ(r.error().code, "unsupported_value") << refused;
    EXPECT_TRUE(r.error().param == "response_format" || r.error().param == "tool_choice");
  }
  auto completion = ParseCompletionRequest(
      R"({"prompt": "a", "response_format": {"type": "json_object"}})", Limits());
  EXPECT_FALSE(completion.ok());
}

TEST(OpenAiRequestTest, TokenizeAndDetokenize) {
  auto t = ParseTokenizeRequest(R"({"prompt": "hello", "add_special_tokens": false})", Limits());
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t.value().prompt, "hello");
  EXPECT_EQ(t.value().add_special_tokens, false);
  auto chat = ParseTokenizeRequest(R"({"messages": [{"role": "user", "content": "x"}]})", Limits());
  ASSERT_TRUE(chat.ok());
  EXPECT_TRUE(chat.value().is_chat);
  EXPECT_FALSE(chat.value().add_special_tokens.has_value());
  auto d = ParseDetokenizeRequest(R"({"tokens": [1, 2]})", Limits());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d.value(), (std::vector<int32_t>{1, 2}));
  EXPECT_FALSE(ParseDetokenizeRequest(R"({"tokens": [1, 512]})", Limits()).ok());
}

// The chat template prints tools and messages with tojson, in the client's key order (Python's);
// a sorted JSON object would change the prompt.
TEST(OpenAiRequestTest, ChatKeepsTheClientsKeyOrder) {
  const std::string tool =
      R"({"type":"function","function":{"name":"f","parameters":{"type":"object",)"
      R"("properties":{"z":{"type":"string"},"a":{"type":"integer"}}}}})";
  const std::string message =
      R"({"role":"assistant","tool_calls":[{"type":"function","function":{"name":"f",)"
      R"("arguments":{"z":"1","a":2}}}],"content":""})";
  auto r =
      ParseChatRequest(R"({"messages": [)" + message + R"(], "tools": [)" + tool + "]}", Limits());
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r.value().tools.dump(), "[" + tool + "]");
  EXPECT_EQ(r.value().messages.dump(), "[" + message + "]");
  auto t = ParseTokenizeRequest(R"({"messages": [)" + message + R"(], "tools": [)" + tool + "]}",
                                Limits());
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(t.value().tools.dump(), "[" + tool + "]");
  EXPECT_EQ(t.value().messages.dump(), "[" + message + "]");
}

// /tokenize reads tools and chat_template_kwargs as the chat endpoint does; this reports them
// through the chat request type so one test body checks both parsers.
http::ApiResult<GenerationRequest> ParseTokenizeAsChat(std::string_view body,
                                                       const ParseLimits& limits) {
  auto t = ParseTokenizeRequest(body, limits);
  if (!t.ok()) return t.error();
  GenerationRequest g;
  g.tools = t.value().tools;
  g.chat_template_kwargs = t.value().chat_template_kwargs;
  return g;
}

TEST(OpenAiRequestTest, ChatTemplateKwargsAreAnObjectOfTemplateVariables) {
  const std::string messages = R"("messages": [{"role": "user", "content": "x"}])";
  for (auto parse : {ParseChatRequest, ParseTokenizeAsChat}) {
    auto r =
        parse("{" + messages + R"(, "chat_template_kwargs": {"enable_thinking": false, "x": [1]}})",
              Limits());
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r.value().chat_template_kwargs.dump(), R"({"enable_thinking":false,"x":[1]})");
    EXPECT_TRUE(r.value().tools.is_null());
    auto absent = parse("{" + messages + R"(, "chat_template_kwargs": null})", Limits());
    ASSERT_TRUE(absent.ok());
    EXPECT_TRUE(absent.value().chat_template_kwargs.is_null());
    for (const char* bad : {R"([1])", R"("enable_thinking")", R"(true)"}) {
      auto e = parse("{" + messages + R"(, "chat_template_kwargs": )" + bad + "}", Limits());
      ASSERT_FALSE(e.ok()) << bad;
      EXPECT_EQ(e.error().param, "chat_template_kwargs");
      EXPECT_EQ(e.error().code, "invalid_type");
    }
    for (const char* reserved :
         {"messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token"}) {
      auto e = parse("{" + messages + R"(, "chat_template_kwargs": {")" + reserved + R"(": 1}})",
                     Limits());
      ASSERT_FALSE(e.ok()) << reserved;
      EXPECT_EQ(e.error().param, "chat_template_kwargs");
      EXPECT_NE(e.error().message.find(reserved), std::string::npos) << e.error().message;
    }
    auto bad_tools = parse("{" + messages + R"(, "tools": {"type": "function"}})", Limits());
    ASSERT_FALSE(bad_tools.ok());
    EXPECT_EQ(bad_tools.error().param, "tools");
  }
}

}  // namespace
}  // namespace pdserve::server
