#include "chat/chat_prompt.h"

#include <optional>

#include "chat/chat_template.h"
#include "common/logging.h"

namespace pdserve::server {

struct ChatPromptRenderer::Impl {
  ChatTemplateSource source;
  std::optional<ChatTemplate> chat_template;  // unset: the plain fallback
};

ChatPromptRenderer::ChatPromptRenderer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ChatPromptRenderer::~ChatPromptRenderer() = default;

Result<std::unique_ptr<ChatPromptRenderer>> ChatPromptRenderer::Create(ChatTemplateSource source) {
  auto impl = std::make_unique<Impl>();
  impl->source = std::move(source);
  if (!impl->source.chat_template.empty()) {
    Result<ChatTemplate> parsed = ChatTemplate::Parse(impl->source.chat_template);
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

Result<ChatPrompt> ChatPromptRenderer::Render(const nlohmann::json& messages,
                                              const nlohmann::json& tools,
                                              bool add_generation_prompt) const {
  if (!impl_->chat_template) {
    return ChatPrompt{RenderPlainChat(messages, add_generation_prompt), /*add_special=*/true};
  }
  ChatRenderOptions options;
  options.add_generation_prompt = add_generation_prompt;
  options.bos_token = impl_->source.bos_token;
  options.eos_token = impl_->source.eos_token;
  if (!tools.is_null()) options.extra["tools"] = tools;
  PD_ASSIGN_OR_RETURN(std::string text, impl_->chat_template->Render(messages, options));
  // The template writes BOS itself where the model wants it.
  return ChatPrompt{std::move(text), /*add_special=*/false};
}

std::string RenderPlainChat(const nlohmann::json& messages, bool add_generation_prompt) {
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

}  // namespace pdserve::server
