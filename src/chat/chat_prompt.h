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

  // messages: normalised by the request parser (content is a string). tools: null or the
  // request's list, the template's `tools`. template_kwargs: null or an object whose keys become
  // template variables (a request's `chat_template_kwargs`, e.g. {"enable_thinking": false});
  // messages, tools, documents, add_generation_prompt, bos_token and eos_token there are
  // ignored: the arguments and the tokenizer set those. As in transformers, `tools` and
  // `documents` are defined even when absent (None). Object keys keep their order (tojson prints
  // them as Python does). Errors (bad kwargs, a template that fails on these inputs) are
  // InvalidArgument.
  Result<ChatPrompt> Render(const nlohmann::ordered_json& messages,
                            const nlohmann::ordered_json& tools,
                            const nlohmann::ordered_json& template_kwargs,
                            bool add_generation_prompt) const;
  bool has_template() const;

 private:
  struct Impl;
  explicit ChatPromptRenderer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The fallback format alone (for tests and docs).
std::string RenderPlainChat(const nlohmann::ordered_json& messages, bool add_generation_prompt);

}  // namespace pdserve::chat
