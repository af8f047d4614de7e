// Tests of ChatPromptRenderer: the model's template when it parses (with the BOS/EOS strings
// the caller hands over), the plain fallback when there is none or it does not parse.
#include "chat/chat_prompt.h"

#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace pdserve::chat {
namespace {

const nlohmann::json kMessages = nlohmann::json::parse(
    R"([{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}])");

TEST(ChatPromptTest, PlainFallbackFormat) {
  EXPECT_EQ(RenderPlainChat(kMessages, true), "system: s\nuser: hi\nassistant: ");
  EXPECT_EQ(RenderPlainChat(kMessages, false), "system: s\nuser: hi\n");
}

TEST(ChatPromptTest, NoTemplateUsesThePlainFallbackWithSpecialTokens) {
  auto renderer = ChatPromptRenderer::Create("", "<s>", "</s>");
  ASSERT_NE(renderer, nullptr);
  EXPECT_FALSE(renderer->has_template());
  auto prompt = renderer->Render(kMessages, nullptr, nullptr, /*add_generation_prompt=*/true);
  ASSERT_TRUE(prompt.ok()) << prompt.status().ToString();
  EXPECT_EQ(prompt->text, RenderPlainChat(kMessages, true));
  EXPECT_TRUE(prompt->add_special) << "the fallback leaves BOS to the tokenizer";
}

TEST(ChatPromptTest, TemplateSeesTheGivenBosAndEosStrings) {
  const std::string tmpl =
      "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ eos_token }}"
      "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}";
  auto renderer = ChatPromptRenderer::Create(tmpl, "<B>", "<E>");
  ASSERT_NE(renderer, nullptr);
  EXPECT_TRUE(renderer->has_template());
  auto prompt = renderer->Render(kMessages, nullptr, nullptr, /*add_generation_prompt=*/true);
  ASSERT_TRUE(prompt.ok()) << prompt.status().ToString();
  EXPECT_EQ(prompt->text, "<B>[system]s<E>[user]hi<E>[assistant]");
  EXPECT_FALSE(prompt->add_special) << "the template wrote BOS itself";
  // Different strings, different text: the renderer takes them from the caller.
  auto other = ChatPromptRenderer::Create(tmpl, "<bos>", "<eos>");
  auto other_prompt = other->Render(kMessages, nullptr, nullptr, /*add_generation_prompt=*/false);
  ASSERT_TRUE(other_prompt.ok());
  EXPECT_EQ(other_prompt->text, "<bos>[system]s<eos>[user]hi<eos>");
}

TEST(ChatPromptTest, TemplateSeesTools) {
  auto renderer = ChatPromptRenderer::Create(
      "{% if tools %}{{ tools | length }} tools{% else %}none{% endif %}", "", "");
  const nlohmann::json tools = nlohmann::json::parse(R"([{"type": "function"}])");
  auto with = renderer->Render(kMessages, tools, nullptr, false);
  ASSERT_TRUE(with.ok()) << with.status().ToString();
  EXPECT_EQ(with->text, "1 tools");
  auto without = renderer->Render(kMessages, nullptr, nullptr, false);
  ASSERT_TRUE(without.ok());
  EXPECT_EQ(without->text, "none");
}

TEST(ChatPromptTest, TemplateThatDoesNotParseFallsBackToPlain) {
  auto renderer = ChatPromptRenderer::Create("{% for m in messages %}unclosed", "<s>", "</s>");
  ASSERT_NE(renderer, nullptr);
  EXPECT_FALSE(renderer->has_template());
  auto prompt = renderer->Render(kMessages, nullptr, nullptr, false);
  ASSERT_TRUE(prompt.ok());
  EXPECT_EQ(prompt->text, RenderPlainChat(kMessages, false));
}

TEST(ChatPromptTest, TemplateErrorIsInvalidArgument) {
  auto renderer = ChatPromptRenderer::Create("{{ raise_exception('no system role') }}", "", "");
  ASSERT_TRUE(renderer->has_template());
  auto prompt = renderer->Render(kMessages, nullptr, nullptr, false);
  ASSERT_FALSE(prompt.ok());
  EXPECT_EQ(prompt.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(prompt.status().message().find("no system role"), std::string::npos);
}

}  // namespace
}  // namespace pdserve::chat
