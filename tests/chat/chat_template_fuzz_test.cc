// Robustness of the chat-template interpreter: randomly mutated templates and odd message
// shapes must give a result or an InvalidArgument, never a crash, hang or other error code.
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "chat/chat_template.h"

namespace pdserve {
namespace {

using nlohmann::json;

const char* const kFixtureTemplates[] = {"llama3_1.jinja", "llama3_2.jinja", "qwen2_5.jinja",
                                         "qwen3.jinja", "mistral_v0_3.jinja"};

std::string ReadFixture(const std::string& name) {
  std::ifstream in(std::filesystem::path(PDSERVE_CHAT_FIXTURES) / name, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Conversations with the usual shapes and with wrong types where strings are expected.
std::vector<json> Conversations() {
  json call = {{"id", "abc123def"}, {"function", {{"name", "f"}, {"arguments", {{"x", 1}}}}}};
  return {
      json::array(),
      json::array({{{"role", "system"}, {"content", "S"}},
                   {{"role", "user"}, {"content", "U"}},
                   {{"role", "assistant"}, {"content", "<think>r</think>A"}},
                   {{"role", "user"}, {"content", "U2"}}}),
      json::array({{{"role", "user"}, {"content", 42}}}),
      json::array({{{"role", "user"}, {"content", nullptr}}}),
      json::array(
          {{{"role", "user"}, {"content", json::array({{{"type", "text"}, {"text", "t"}}})}}}),
      json::array({{{"role", 7}}}),
      json::array({json("not an object"), 3.5, nullptr}),
      json::array({{{"role", "user"}, {"content", "q"}},
                   {{"role", "assistant"}, {"tool_calls", json::array({call, call})}},
                   {{"role", "tool"}, {"tool_call_id", "abc123def"}, {"content", {{"r", 1}}}}}),
  };
}

void ExpectOkOrInvalidArgument(const Result<std::string>& out, const std::string& context) {
  if (!out.ok()) {
    EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument)
        << context << ": " << out.status().ToString();
  }
}

TEST(ChatTemplateFuzzTest, OddMessagesNeverCrash) {
  for (const char* name : kFixtureTemplates) {
    auto tmpl = ChatTemplate::Parse(ReadFixture(name));
    ASSERT_TRUE(tmpl.ok()) << name;
    for (const json& messages : Conversations()) {
      for (bool with_tools : {false, true}) {
        ChatRenderOptions options;
        if (with_tools) options.extra = {{"tools", json::array({{{"function", {{"name", "f"}}}}})}};
        ExpectOkOrInvalidArgument(tmpl->Render(messages, options), name + messages.dump());
      }
    }
  }
}

TEST(ChatTemplateFuzzTest, MutatedTemplatesNeverCrash) {
  std::mt19937 rng(1234);
  const std::string alphabet = "{}%#-+()[]'\"|.,:~=!<>*/ \n\tabcxyz019_";
  const std::vector<json> conversations = Conversations();
  int parsed = 0, total = 0;
  for (const char* name : kFixtureTemplates) {
    const std::string original = ReadFixture(name);
    ASSERT_FALSE(original.empty()) << name;
    for (int round = 0; round < 150; ++round) {
      std::string source = original;
      int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits && !source.empty(); ++e) {
        size_t at = rng() % source.size();
        switch (rng() % 4) {
          case 0:
            source.erase(at, 1 + rng() % 8);
            break;
          case 1:
            source.insert(at, 1, alphabet[rng() % alphabet.size()]);
            break;
          case 2:
            source[at] = alphabet[rng() % alphabet.size()];
            break;
          default:
            source.resize(at);
        }
      }
      ++total;
      auto tmpl = ChatTemplate::Parse(source);
      if (!tmpl.ok()) {
        EXPECT_EQ(tmpl.status().code(), StatusCode::kInvalidArgument);
        continue;
      }
      ++parsed;
      const json& messages = conversations[round % conversations.size()];
      ExpectOkOrInvalidArgument(tmpl->Render(messages, {}),
                                std::string(name) + " round " + std::to_string(round));
    }
  }
  // Both paths were exercised: some mutants still parse, some do not.
  EXPECT_GT(parsed, 0);
  EXPECT_LT(parsed, total);
}

}  // namespace
}  // namespace pdserve
