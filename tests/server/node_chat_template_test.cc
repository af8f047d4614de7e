// Integration test of the chat template's inputs through `pdserve serve`: /tokenize with
// messages renders exactly the prompt /v1/chat/completions generates from, tools and
// chat_template_kwargs included, with the tools' keys in the client's order.
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "testing/node_process.h"
#include "testing/test_paths.h"

namespace pdserve::testing {
namespace {

using json = nlohmann::json;

// Prints every input the chat endpoint hands the template: tools (tojson), a kwarg, messages.
constexpr char kToolsTemplate[] =
    "{%- if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>\n"
    "{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n"
    "{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}"
    "{% endif %}";

// The tiny synthetic model with kToolsTemplate as its chat template, in a fresh directory.
std::string ModelWithToolsTemplate() {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(MakeTempDir("chat_tools_model")) / "model";
  fs::copy(TinyModelDir(), dir, fs::copy_options::recursive);
  const fs::path config_path = dir / "tokenizer_config.json";
  std::ifstream in(config_path);
  json config = json::parse(in, nullptr, /*allow_exceptions=*/false);
  EXPECT_TRUE(config.is_object()) << config_path;
  config["chat_template"] = kToolsTemplate;
  std::ofstream(config_path, std::ios::trunc) << config.dump();
  return dir.string();
}

class NodeChatTemplateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_dir_ = ModelWithToolsTemplate();
    node_ = std::make_unique<NodeProcess>(model_dir_, std::vector<std::string>{});
    ASSERT_TRUE(node_->ok()) << node_->error();
  }
  void TearDown() override {
    node_.reset();
    std::filesystem::remove_all(std::filesystem::path(model_dir_).parent_path());
  }
  std::string model_dir_;
  std::unique_ptr<NodeProcess> node_;
};

TEST_F(NodeChatTemplateTest, TokenizeRendersToolsAndKwargsExactlyAsChat) {
  auto client = node_->Client();
  // Raw JSON text: the keys' order is the client's (not sorted), and must reach tojson as is.
  const std::string tool =
      R"({"type":"function","function":{"name":"get_weather","parameters":{"type":"object",)"
      R"("properties":{"city":{"type":"string"}},"required":["city"]}}})";
  const std::string inputs = R"("messages": [{"role": "user", "content": "  Weather?  "}],)"
                             R"( "tools": [)" +
                             tool + R"(], "chat_template_kwargs": {"enable_thinking": false})";
  auto tok = client.Post("/tokenize", "{" + inputs + "}", "application/json");
  ASSERT_TRUE(tok);
  ASSERT_EQ(tok->status, 200) << tok->body;
  const json ids = json::parse(tok->body)["tokens"];
  auto detok = client.Post("/detokenize", json{{"tokens", ids}}.dump(), "application/json");
  ASSERT_TRUE(detok);
  EXPECT_EQ(json::parse(detok->body)["prompt"],
            "<tools>{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
            "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": "
            "\"string\"}}, \"required\": [\"city\"]}}}</tools>\n"
            "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n<think></think>");

  auto chat = client.Post("/v1/chat/completions",
                          "{" + inputs + R"(, "max_tokens": 2, "return_token_ids": true})",
                          "application/json");
  ASSERT_TRUE(chat);
  ASSERT_EQ(chat->status, 200) << chat->body;
  EXPECT_EQ(json::parse(chat->body)["choices"][0]["prompt_token_ids"], ids);

  // Without tools and kwargs the prompt differs: both really reach the template.
  auto plain =
      client.Post("/tokenize", R"({"messages": [{"role": "user", "content": "  Weather?  "}]})",
                  "application/json");
  ASSERT_TRUE(plain);
  ASSERT_EQ(plain->status, 200) << plain->body;
  EXPECT_LT(json::parse(plain->body)["count"].get<size_t>(), ids.size());
}

TEST_F(NodeChatTemplateTest, BadChatTemplateKwargsAre400OnBothEndpoints) {
  auto client = node_->Client();
  for (const char* path : {"/tokenize", "/v1/chat/completions"}) {
    for (const char* kwargs : {R"([1])", R"({"messages": []})"}) {
      const std::string body =
          std::string(
              R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": )") +
          kwargs + "}";
      auto res = client.Post(path, body, "application/json");
      ASSERT_TRUE(res) << path;
      EXPECT_EQ(res->status, 400) << path << " " << kwargs << ": " << res->body;
      EXPECT_EQ(json::parse(res->body)["error"]["param"], "chat_template_kwargs") << res->body;
    }
  }
}

}  // namespace
}  // namespace pdserve::testing
