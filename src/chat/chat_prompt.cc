#include "chat/chat_prompt.h"

#include <optional>

#include "chat/chat_template.h"
#include "common/logging.h"

namespace pdserve::chat {

struct ChatPromptRenderer::Impl {
  std::string bos_token;
  std::string eos_token;
  std::optional<ChatTemplate> chat_template;  // unset: the plain fallback
};

ChatPromptRenderer::ChatPromptRenderer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ChatPromptRenderer::~ChatPromptRenderer() = default;

std::unique_ptr<ChatPromptRenderer> ChatPromptRenderer::Create(std::string_view chat_template,
                                                               std::string bos_token,
                                                               std::string eos_token) {
  auto impl = std::make_unique<Impl>();
  impl->bos_token = std::move(bos_token);
  impl->eos_token = std::move(eos_token);
  if (!chat_template.empty()) {
    Result<ChatTemplate> parsed = ChatTemplate::Parse(std::string(chat_template));
    if (!parsed.ok()) {
      // Completions still work; chat falls back to the plain format, loudly.
      PD_LOG_WARN("the model's chat_template does not parse ({}); chat uses the plain fallback",
                  parsed.status().ToString());
    } else {
      impl->chat_template = std::move(parsed).value();
    }
  }
  return std::unique_ptr<ChatPromptRenderer>(new ChatPromptRenderer(std::move(impl)));
}

bool ChatPromptRenderer::has_template() const { return impl_->chat_template.has_value(); }

Result<ChatPrompt> ChatPromptRenderer::Render(const nlohmann::ordered_json& messages,
                                              const nlohmann::ordered_json& tools,
                                              const nlohmann::ordered_json& template_kwargs,
                                              bool add_generation_prompt) const {
  if (!template_kwargs.is_null() && !template_kwargs.is_object()) {
    return Status::InvalidArgument("chat_template_kwargs must be a JSON object");
  }
  if (!impl_->chat_template) {
    return ChatPrompt{RenderPlainChat(messages, add_generation_prompt), /*add_special=*/true};
  }
  ChatRenderOptions options;
  options.add_generation_prompt = add_generation_prompt;
  options.bos_token = impl_->bos_token;
  options.eos_token = impl_->eos_token;
  if (template_kwargs.is_object()) {
    // The template's own inputs come from the request fields, never from the kwargs.
    for (const auto& [key, value] : template_kwargs.items()) {
      if (key != "tools" && key != "documents") options.extra[key] = value;
    }
  }
  // As transformers' apply_chat_template: tools and documents are always defined, None when
  // absent (a template's `tools is defined` is true either way).
  options.extra["tools"] = tools;
  options.extra["documents"] = nullptr;
  PD_ASSIGN_OR_RETURN(std::string text, impl_->chat_template->Render(messages, options));
  // The template writes BOS itself where the model wants it.
  return ChatPrompt{std::move(text), /*add_special=*/false};
}

std::string RenderPlainChat(const nlohmann::ordered_json& messages, bool add_generation_prompt) {
  std::string out;
  for (const auto& m : messages) {
    if (!m.is_object()) continue;
    auto role = m.find("role");
    auto content = m.find("content");
    out += role != m.end() && role->is_string() ? role->get<std::string>() : "user";
    out += ": ";
    if (content != m.end() && content->is_string()) out += content->get<std::string>();
    out += "\n";
  }
  if (add_generation_prompt) out += "assistant: ";
  return out;
}

}  // namespace pdserve::chat
