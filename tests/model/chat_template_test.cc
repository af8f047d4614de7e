// Tests of the chat-template Jinja subset: syntax, semantics, errors and limits.
#include "model/chat_template.h"

#include <string>

#include <gtest/gtest.h>

namespace pdserve {
namespace {

// EXPECT that `status` is an InvalidArgument whose message contains `needle`.
#define EXPECT_ERROR_HAS(status, needle)                                      \
  do {                                                                        \
    const Status& s_ = (status);                                              \
    EXPECT_EQ(s_.code(), StatusCode::kInvalidArgument) << s_.ToString();      \
    EXPECT_NE(s_.message().find(needle), std::string::npos) << s_.ToString(); \
  } while (0)

// Renders `source` with `messages` (and options); fails the test on any error.
std::string RenderOk(const std::string& source,
                     const nlohmann::json& messages = nlohmann::json::array(),
                     ChatRenderOptions options = {}) {
  auto tmpl = ChatTemplate::Parse(source);
  EXPECT_TRUE(tmpl.ok()) << tmpl.status().ToString();
  if (!tmpl.ok()) return "<parse error>";
  auto out = tmpl->Render(messages, options);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  return out.ok() ? *out : "<render error>";
}

Status RenderError(const std::string& source,
                   const nlohmann::json& messages = nlohmann::json::array(),
                   ChatRenderOptions options = {}) {
  auto tmpl = ChatTemplate::Parse(source);
  if (!tmpl.ok()) return tmpl.status();
  auto out = tmpl->Render(messages, options);
  if (out.ok()) return Status::Internal("rendered without error: " + *out);
  return out.status();
}

TEST(ChatTemplateTest, ChatMlConversation) {
  const std::string source =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
      "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
      "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  nlohmann::json messages = {{{"role", "user"}, {"content", "Hi"}}};
  EXPECT_EQ(RenderOk(source, messages), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  ChatRenderOptions no_prompt;
  no_prompt.add_generation_prompt = false;
  EXPECT_EQ(RenderOk(source, messages, no_prompt), "<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplateTest, SyntaxErrorNamesLineAndColumn) {
  auto tmpl = ChatTemplate::Parse("hello\n{% if x %}\n{{ 1 + }}\n{% endif %}");
  ASSERT_FALSE(tmpl.ok());
  EXPECT_ERROR_HAS(tmpl.status(), "line 3 col");
}

TEST(ChatTemplateTest, RaiseExceptionSurfacesTheTemplatesMessage) {
  Status s = RenderError("{{ raise_exception('roles must alternate') }}");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "chat template: roles must alternate");
}

}  // namespace
}  // namespace pdserve
