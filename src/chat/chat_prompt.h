// ChatPromptRenderer: turns chat messages into the prompt text a model expects — through the
// model's own chat template when it has one, else through the plain fallback documented in
// docs/api.md ("<role>: <content>\n" per message, then "assistant: "). Immutable after
// Create: Render is safe from any thread.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace pdserve::server {

struct ChatPrompt {
  std::string text;
  // Whether encoding should add the tokenizer's BOS/EOS: false when a template rendered them.
  bool add_special = true;
};

// What a renderer needs from the model's tokenizer (chat/ does not depend on tokenizer/).
struct ChatTemplateSource {
  std::string chat_template;  // empty: the plain fallback
  std::string bos_token;
  std::string eos_token;
};

class ChatPromptRenderer {
 public:
  static Result<std::unique_ptr<ChatPromptRenderer>> Create(ChatTemplateSource source);
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

}  // namespace pdserve::server
