#include "server/chat_prompt.h"

namespace pdserve::server {

struct ChatPromptRenderer::Impl {
  const Tokenizer* tokenizer = nullptr;
};

ChatPromptRenderer::ChatPromptRenderer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ChatPromptRenderer::~ChatPromptRenderer() = default;

Result<std::unique_ptr<ChatPromptRenderer>> ChatPromptRenderer::Create(const Tokenizer* tokenizer) {
  auto impl = std::make_unique<Impl>();
  impl->tokenizer = tokenizer;
  return std::unique_ptr<ChatPromptRenderer>(new ChatPromptRenderer(std::move(impl)));
}

bool ChatPromptRenderer::has_template() const { return false; }

Result<ChatPrompt> ChatPromptRenderer::Render(const nlohmann::json& messages,
                                              const nlohmann::json& /*tools*/,
                                              bool add_generation_prompt) const {
  return ChatPrompt{RenderPlainChat(messages, add_generation_prompt), /*add_special=*/true};
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
