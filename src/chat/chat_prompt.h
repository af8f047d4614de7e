// ChatPromptRenderer: turns chat messages into the prompt text a model expects — through the
// model's own chat template when it has one, else through the plain fallback documented in
// docs/api.md ("<role>: <content>\n" per message, then "assistant: "). Knows no tokenizer: the
// caller hands over the template text and the BOS/EOS strings the template may print.
// Immutable after Create: Render is safe from any thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace pdserve::chat {

struct ChatPrompt {
  std::string text;
  // Whether encoding should add the tokenizer's BOS/EOS: false when a template rendered them.
  bool add_special = true;
};

class ChatPromptRenderer {
 public:
  // chat_template: the model's Jinja template (tokenizer_config.json), empty for none.
  // bos_token/eos_token: the strings the template sees as bos_token and eos_token. A template
  // that does not parse is logged and replaced by the plain fallback (completions still work),
  // so Create does not fail on model data.
  static std::unique_ptr<ChatPromptRenderer> Create(std::string_view chat_template,
                                                    std::string bos_token, std::string eos_token);
  ChatPromptRenderer(const ChatPromptRenderer&) = delete;
  ChatPromptRenderer& operator=(const ChatPromptRenderer&) = delete;
  ~ChatPromptRenderer();

  // messages: normalised by the request parser (content is a string). Errors (a template
  // that fails on these messages) are InvalidArgument.
  Result<ChatPrompt> Render(const nlohmann::json& messages, const nlohmann::json& tools,
                            bool add_generation_prompt) const;
  bool has_template() const;

 private:
  struct Impl;
  explicit ChatPromptRenderer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The fallback format alone (for tests and docs).
std::string RenderPlainChat(const nlohmann::json& messages, bool add_generation_prompt);

}  // namespace pdserve::chat
