// Renders the published chat templates of Llama 3.2, Qwen2.5, Qwen3 and Mistral v0.3 (fixtures
// in fixtures/) and the real Qwen2 template from ../shared, comparing with the
// exact strings each template's logic produces (derived by hand from the template source).
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "testing/test_paths.h"

namespace pdserve {
namespace {

using nlohmann::json;
using ::pdserve::testing::ReadFile;

// 26 Jul 2024 12:00 UTC: strftime_now's fixed clock.
constexpr int64_t kJul26 = 1721995200;

ChatTemplate LoadFixture(const std::string& name) {
  std::filesystem::path dir = std::filesystem::path(PDSERVE_CHAT_FIXTURES);
  std::string source = ReadFile(dir / name);
  EXPECT_FALSE(source.empty()) << "missing fixture " << (dir / name);
  auto tmpl = ChatTemplate::Parse(source);
  EXPECT_TRUE(tmpl.ok()) << name << ": " << tmpl.status().ToString();
  return tmpl.ok() ? std::move(tmpl).value() : ChatTemplate::Parse("").value();
}

std::string Render(const ChatTemplate& tmpl, const json& messages, ChatRenderOptions options) {
  auto out = tmpl.Render(messages, options);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  return out.ok() ? *out : "<error: " + out.status().ToString() + ">";
}

Status RenderStatus(const ChatTemplate& tmpl, const json& messages, ChatRenderOptions options) {
  auto out = tmpl.Render(messages, options);
  return out.ok() ? Status::Internal("rendered: " + *out) : out.status();
}

json Conversation() {
  return json::array({{{"role", "system"}, {"content", "You are a helpful assistant."}},
                      {{"role", "user"}, {"content", "Hello"}},
                      {{"role", "assistant"}, {"content", "Hi there!"}},
                      {{"role", "user"}, {"content", "How are you?"}}});
}

// Keys in alphabetical order: nlohmann::json objects iterate sorted (see the fixtures README).
json WeatherTool() {
  return json::parse(R"({"function": {"description": "Get the weather", "name": "get_weather",
      "parameters": {"properties": {"city": {"type": "string"}}, "required": ["city"],
      "type": "object"}}, "type": "function"})");
}

const char kWeatherToolJson[] =
    R"({"function": {"description": "Get the weather", "name": "get_weather", "parameters": )"
    R"({"properties": {"city": {"type": "string"}}, "required": ["city"], "type": "object"}}, )"
    R"("type": "function"})";

ChatRenderOptions LlamaOptions() {
  ChatRenderOptions o;
  o.bos_token = "<|begin_of_text|>";
  o.eos_token = "<|eot_id|>";
  o.now_unix_seconds = kJul26;
  return o;
}

TEST(ChatTemplateLlama3Test, SystemUserAssistantUser) {
  ChatTemplate tmpl = LoadFixture("llama3_2.jinja");
  EXPECT_EQ(Render(tmpl, Conversation(), LlamaOptions()),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
            "You are a helpful assistant.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHi there!<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHow are you?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplateLlama3Test, NoSystemMessageTrimsContentAndHonoursDateString) {
  ChatTemplate tmpl = LoadFixture("llama3_2.jinja");
  ChatRenderOptions o = LlamaOptions();
  o.add_generation_prompt = false;
  o.extra = {{"date_string", "01 Jan 2025"}};
  json messages = json::array({{{"role", "user"}, {"content", "  padded  "}}});
  EXPECT_EQ(Render(tmpl, messages, o),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 01 Jan 2025\n\n<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\npadded<|eot_id|>");
}

TEST(ChatTemplateLlama3Test, ToolsGoIntoTheFirstUserMessage) {
  ChatTemplate tmpl = LoadFixture("llama3_2.jinja");
  ChatRenderOptions o = LlamaOptions();
  o.extra = {{"tools", json::array({WeatherTool()})}};
  json messages = json::array(
      {{{"role", "user"}, {"content", "Weather in Paris?"}},
       {{"role", "assistant"},
        {"tool_calls",
         json::array(
             {{{"function", {{"name", "get_weather"}, {"arguments", {{"city", "Paris"}}}}}}})}},
       {{"role", "tool"}, {"content", "21 C"}}});
  const std::string indented_tool = R"({
    "function": {
        "description": "Get the weather",
        "name": "get_weather",
        "parameters": {
            "properties": {
                "city": {
                    "type": "string"
                }
            },
            "required": [
                "city"
            ],
            "type": "object"
        }
    },
    "type": "function"
})";
  EXPECT_EQ(Render(tmpl, messages, o),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Environment: ipython\nCutting Knowledge Date: December 2023\n"
            "Today Date: 26 Jul 2024\n\n<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\n"
            "Given the following functions, please respond with a JSON for a function call "
            "with its proper arguments that best answers the given prompt.\n\n"
            "Respond in the format {\"name\": function name, \"parameters\": dictionary of "
            "argument name and its value}.Do not use variables.\n\n" +
                indented_tool +
                "\n\nWeather in Paris?<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n"
                "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eot_id|>"
                // A string tool result "is iterable", so the template JSON-quotes it.
                "<|start_header_id|>ipython<|end_header_id|>\n\n\"21 C\"<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplateLlama3Test, TwoToolCallsRaise) {
  ChatTemplate tmpl = LoadFixture("llama3_2.jinja");
  json call = {{"function", {{"name", "f"}, {"arguments", json::object()}}}};
  json messages = json::array({{{"role", "user"}, {"content", "x"}},
                               {{"role", "assistant"}, {"tool_calls", json::array({call, call})}}});
  Status s = RenderStatus(tmpl, messages, LlamaOptions());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("This model only supports single tool-calls at once!"),
            std::string::npos)
      << s.ToString();
}

TEST(ChatTemplateLlama3Test, StrftimeNowFollowsTheClock) {
  ChatTemplate tmpl = LoadFixture("llama3_2.jinja");
  ChatRenderOptions o = LlamaOptions();
  o.now_unix_seconds = 0;
  std::string out = Render(tmpl, Conversation(), o);
  EXPECT_NE(out.find("Today Date: 01 Jan 1970\n"), std::string::npos) << out;
}

TEST(ChatTemplateLlama3Test, Llama31BuiltinToolsUsePythonTagAndEom) {
  ChatTemplate tmpl = LoadFixture("llama3_1.jinja");
  ChatRenderOptions o = LlamaOptions();
  o.now_unix_seconds = 0;  // Llama 3.1 does not read the clock: its default date is fixed
  o.extra = {{"builtin_tools", {"brave_search", "code_interpreter", "wolfram_alpha"}}};
  json messages = json::array(
      {{{"role", "system"}, {"content", "S"}},
       {{"role", "user"}, {"content", "Search X"}},
       {{"role", "assistant"},
        {"tool_calls",
         json::array(
             {{{"function", {{"name", "brave_search"}, {"arguments", {{"query", "X"}}}}}}})}},
       {{"role", "ipython"}, {"content", "result"}}});
  EXPECT_EQ(Render(tmpl, messages, o),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Environment: ipython\nTools: brave_search, wolfram_alpha\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nS<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nSearch X<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n"
            "<|python_tag|>brave_search.call(query=\"X\")<|eom_id|>"
            "<|start_header_id|>ipython<|end_header_id|>\n\n\"result\"<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // Without built-in tools it renders like Llama 3.2 with the fixed date.
  ChatRenderOptions plain = LlamaOptions();
  plain.now_unix_seconds = 0;
  EXPECT_EQ(Render(tmpl, Conversation(), plain),
            Render(LoadFixture("llama3_2.jinja"), Conversation(), LlamaOptions()));
}

TEST(ChatTemplateQwen25Test, SystemUserAssistantUser) {
  ChatTemplate tmpl = LoadFixture("qwen2_5.jinja");
  EXPECT_EQ(Render(tmpl, Conversation(), {}),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHello<|im_end|>\n"
            "<|im_start|>assistant\nHi there!<|im_end|>\n"
            "<|im_start|>user\nHow are you?<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplateQwen25Test, DefaultSystemPromptWithoutGenerationPrompt) {
  ChatTemplate tmpl = LoadFixture("qwen2_5.jinja");
  ChatRenderOptions o;
  o.add_generation_prompt = false;
  json messages = json::array({{{"role", "user"}, {"content", "Hello"}}});
  EXPECT_EQ(Render(tmpl, messages, o),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
            "assistant.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n");
}

TEST(ChatTemplateQwen25Test, ToolsToolCallsAndToolResponses) {
  ChatTemplate tmpl = LoadFixture("qwen2_5.jinja");
  ChatRenderOptions o;
  o.extra = {{"tools", json::array({WeatherTool()})}};
  json messages = json::array(
      {{{"role", "system"}, {"content", "You are a bot."}},
       {{"role", "user"}, {"content", "Weather in Paris?"}},
       {{"role", "assistant"},
        {"content", ""},
        {"tool_calls",
         json::array(
             {{{"id", "call_1"},
               {"type", "function"},
               {"function", {{"name", "get_weather"}, {"arguments", {{"city", "Paris"}}}}}}})}},
       {{"role", "tool"}, {"content", "{\"temp\": 21}"}},
       {{"role", "tool"}, {"content", "second"}}});
  EXPECT_EQ(Render(tmpl, messages, o),
            std::string("<|im_start|>system\nYou are a bot.\n\n# Tools\n\nYou may call one or "
                        "more functions to assist with the user query.\n\nYou are provided with "
                        "function signatures within <tools></tools> XML tags:\n<tools>\n") +
                kWeatherToolJson +
                "\n</tools>\n\nFor each function call, return a json object with function name "
                "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
                "</tool_call><|im_end|>\n"
                "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
                "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                "{\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n"
                "<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response>"
                "\n<tool_response>\nsecond\n</tool_response><|im_end|>\n"
                "<|im_start|>assistant\n");
}

TEST(ChatTemplateQwen3Test, SystemUserAssistantUser) {
  ChatTemplate tmpl = LoadFixture("qwen3.jinja");
  const std::string history =
      "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
      "<|im_start|>user\nHello<|im_end|>\n"
      "<|im_start|>assistant\nHi there!<|im_end|>\n"
      "<|im_start|>user\nHow are you?<|im_end|>\n"
      "<|im_start|>assistant\n";
  EXPECT_EQ(Render(tmpl, Conversation(), {}), history);
  ChatRenderOptions no_think;
  no_think.extra = {{"enable_thinking", false}};
  EXPECT_EQ(Render(tmpl, Conversation(), no_think), history + "<think>\n\n</think>\n\n");
}

TEST(ChatTemplateQwen3Test, ThinkingIsKeptAfterTheLastQueryAndDroppedBefore) {
  ChatTemplate tmpl = LoadFixture("qwen3.jinja");
  ChatRenderOptions o;
  o.add_generation_prompt = false;
  json messages =
      json::array({{{"role", "user"}, {"content", "Q1"}},
                   {{"role", "assistant"}, {"content", "<think>\nold reasoning\n</think>\n\nA1"}},
                   {{"role", "user"}, {"content", "What is 2+2?"}},
                   {{"role", "assistant"}, {"content", "<think>\nAdd them.\n</think>\n\n4"}}});
  EXPECT_EQ(Render(tmpl, messages, o),
            "<|im_start|>user\nQ1<|im_end|>\n"
            "<|im_start|>assistant\nA1<|im_end|>\n"
            "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nAdd them.\n</think>\n\n4<|im_end|>\n");
}

TEST(ChatTemplateQwen3Test, ReasoningContentFieldAndToolResponsesAsQueries) {
  ChatTemplate tmpl = LoadFixture("qwen3.jinja");
  ChatRenderOptions o;
  o.add_generation_prompt = false;
  // A user message wrapped in <tool_response> is not a query: the last query is message 0, so
  // the assistant turn after it keeps its reasoning even though it is not last.
  json messages =
      json::array({{{"role", "user"}, {"content", "Q"}},
                   {{"role", "assistant"}, {"content", "A"}, {"reasoning_content", "\nthought\n"}},
                   {{"role", "user"}, {"content", "<tool_response>\nok\n</tool_response>"}}});
  EXPECT_EQ(Render(tmpl, messages, o),
            "<|im_start|>user\nQ<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nthought\n</think>\n\nA<|im_end|>\n"
            "<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n");
}

TEST(ChatTemplateQwen3Test, ToolCallWithStringArguments) {
  ChatTemplate tmpl = LoadFixture("qwen3.jinja");
  ChatRenderOptions o;
  o.add_generation_prompt = false;
  json messages = json::array(
      {{{"role", "user"}, {"content", "Weather?"}},
       {{"role", "assistant"},
        {"content", "Let me check."},
        {"tool_calls",
         json::array({{{"function",
                        {{"name", "get_weather"}, {"arguments", "{\"city\": \"Oslo\"}"}}}}})}}});
  EXPECT_EQ(Render(tmpl, messages, o),
            "<|im_start|>user\nWeather?<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\nLet me check.\n<tool_call>\n"
            "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n"
            "</tool_call><|im_end|>\n");
}

ChatRenderOptions MistralOptions() {
  ChatRenderOptions o;
  o.bos_token = "<s>";
  o.eos_token = "</s>";
  return o;
}

TEST(ChatTemplateMistralTest, SystemUserAssistantUser) {
  ChatTemplate tmpl = LoadFixture("mistral_v0_3.jinja");
  EXPECT_EQ(Render(tmpl, Conversation(), MistralOptions()),
            "<s>[INST] Hello[/INST] Hi there!</s>"
            "[INST] You are a helpful assistant.\n\nHow are you?[/INST]");
}

TEST(ChatTemplateMistralTest, RolesMustAlternate) {
  ChatTemplate tmpl = LoadFixture("mistral_v0_3.jinja");
  json messages =
      json::array({{{"role", "user"}, {"content", "a"}}, {{"role", "user"}, {"content", "b"}}});
  Status s = RenderStatus(tmpl, messages, MistralOptions());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "chat template: After the optional system message, conversation roles must "
            "alternate user/assistant/user/assistant/...");
  json unknown = json::array({{{"role", "narrator"}, {"content", "x"}}});
  s = RenderStatus(tmpl, unknown, MistralOptions());
  EXPECT_NE(s.message().find("conversation roles must alternate"), std::string::npos);
}

TEST(ChatTemplateMistralTest, ToolsToolCallsAndResults) {
  ChatTemplate tmpl = LoadFixture("mistral_v0_3.jinja");
  ChatRenderOptions o = MistralOptions();
  o.extra = {{"tools", json::array({WeatherTool()})}};
  json messages = json::array(
      {{{"role", "user"}, {"content", "Weather in Paris?"}},
       {{"role", "assistant"},
        {"tool_calls",
         json::array(
             {{{"id", "abc123def"},
               {"function", {{"name", "get_weather"}, {"arguments", {{"city", "Paris"}}}}}}})}},
       {{"role", "tool"}, {"tool_call_id", "abc123def"}, {"content", "21 C"}}});
  EXPECT_EQ(Render(tmpl, messages, o),
            "<s>[AVAILABLE_TOOLS] [{\"type\": \"function\", \"function\": {"
            "\"description\": \"Get the weather\", \"name\": \"get_weather\", \"parameters\": "
            "{\"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"], "
            "\"type\": \"object\"}}}][/AVAILABLE_TOOLS][INST] Weather in Paris?[/INST]"
            "[TOOL_CALLS] [{\"arguments\": {\"city\": \"Paris\"}, \"name\": \"get_weather\", "
            "\"id\": \"abc123def\"}]</s>"
            "[TOOL_RESULTS] {\"content\": 21 C, \"call_id\": \"abc123def\"}[/TOOL_RESULTS]");
  // Tool call ids must have 9 characters.
  messages[1]["tool_calls"][0]["id"] = "short";
  Status s = RenderStatus(tmpl, messages, o);
  EXPECT_NE(s.message().find("Tool call IDs should be alphanumeric strings with length 9!"),
            std::string::npos)
      << s.ToString();
}

TEST(ChatTemplateQwen2SharedTest, RealTokenizerConfigTemplate) {
  PD_REQUIRE_SHARED("tokenizers/qwen2/tokenizer_config.json");
  json config = json::parse(ReadFile(testing::SharedPath("tokenizers/qwen2/tokenizer_config.json")),
                            nullptr, false);
  ASSERT_TRUE(config.is_object());
  ASSERT_TRUE(config.contains("chat_template"));
  auto tmpl = ChatTemplate::Parse(config["chat_template"].get<std::string>());
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().ToString();
  json messages = json::array({{{"role", "user"}, {"content", "Hello"}},
                               {{"role", "assistant"}, {"content", "Hi!"}},
                               {{"role", "user"}, {"content", "Bye"}}});
  EXPECT_EQ(Render(*tmpl, messages, {}),
            "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n"
            "<|im_start|>user\nHello<|im_end|>\n"
            "<|im_start|>assistant\nHi!<|im_end|>\n"
            "<|im_start|>user\nBye<|im_end|>\n"
            "<|im_start|>assistant\n");
  // With a system message of its own, no default one is added.
  EXPECT_EQ(Render(*tmpl, Conversation(), {})
                .rfind("<|im_start|>system\nYou are a helpful "
                       "assistant.<|im_end|>\n<|im_start|>user\n",
                       0),
            0u);
}

TEST(ChatTemplateFamiliesTest, ConcurrentRendersAgree) {
  ChatTemplate tmpl = LoadFixture("qwen3.jinja");
  const std::string expected = Render(tmpl, Conversation(), {});
  std::vector<std::string> outputs(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < outputs.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        auto out = tmpl.Render(Conversation(), {});
        outputs[t] = out.ok() ? *out : out.status().ToString();
        if (outputs[t] != expected) return;
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const std::string& out : outputs) EXPECT_EQ(out, expected);
}

}  // namespace
}  // namespace pdserve
