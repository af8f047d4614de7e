#include "chat/chat_template.h"

#include <chrono>
#include <utility>

#include "chat/jinja_ast.h"
#include "chat/jinja_eval.h"
#include "chat/jinja_parser.h"
#include "chat/jinja_value.h"
#include "common/check.h"

namespace pdserve {
namespace {

// Deepest JSON nesting accepted in messages and extra variables (bounds recursion).
constexpr int kMaxJsonDepth = 64;

int64_t SystemNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Result<ChatTemplate> ChatTemplate::Parse(std::string source) {
  auto program = jinja::ParseProgram(std::move(source));
  if (!program.ok()) {
    return Status::InvalidArgument("chat template " + program.status().message());
  }
  return ChatTemplate(std::move(program).value());
}

const char ChatTemplate::kFallbackSource[] =
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ message.role }}: "
    "{% if message.content is string %}{{ message.content }}"
    "{% else %}{{ message.content | selectattr('type', 'equalto', 'text') | map(attribute='text')"
    " | join('') }}{% endif %}"
    // trim_blocks would eat a newline written right after a tag.
    "{{ '\\n\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}";

ChatTemplate ChatTemplate::Fallback() {
  auto program = jinja::ParseProgram(kFallbackSource);
  PD_CHECK(program.ok());  // a constant; a failure is a bug in this file
  return ChatTemplate(std::move(program).value());
}

const std::string& ChatTemplate::source() const { return program_->source; }

Result<std::string> ChatTemplate::Render(const nlohmann::ordered_json& messages,
                                         const ChatRenderOptions& options) const {
  if (!messages.is_array()) return Status::InvalidArgument("messages must be a JSON array");
  if (!options.extra.is_object()) {
    return Status::InvalidArgument("chat template variables (extra) must be a JSON object");
  }
  jinja::ValueDict context;
  for (const auto& [key, value] : options.extra.items()) {
    auto v = jinja::Value::FromJson(value, kMaxJsonDepth);
    if (!v.ok())
      return Status::InvalidArgument("chat template variable '" + key +
                                     "': " + v.status().message());
    context.emplace_back(key, std::move(v).value());
  }
  auto msgs = jinja::Value::FromJson(messages, kMaxJsonDepth);
  if (!msgs.ok()) return Status::InvalidArgument("messages: " + msgs.status().message());
  context.emplace_back("messages", std::move(msgs).value());
  context.emplace_back("add_generation_prompt", jinja::Value::Bool(options.add_generation_prompt));
  context.emplace_back("bos_token", jinja::Value::String(options.bos_token));
  context.emplace_back("eos_token", jinja::Value::String(options.eos_token));

  jinja::Evaluator evaluator(jinja::RenderLimits{}, options.now_unix_seconds.value_or(SystemNow()));
  auto out = evaluator.Render(*program_, std::move(context));
  if (!out.ok()) return Status::InvalidArgument("chat template: " + out.status().message());
  return out;
}

}  // namespace pdserve
