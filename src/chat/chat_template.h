// ChatTemplate: renders a conversation into a prompt with a model's Hugging Face `chat_template`
// (a Jinja subset sufficient for the Llama 3.x, Qwen2.5, Qwen3 and Mistral templates).
//
// Semantics follow Hugging Face's `apply_chat_template` environment: trim_blocks and
// lstrip_blocks on, Jinja's default Undefined (prints as "", attribute access on it fails),
// transformers' `tojson` (json.dumps with ensure_ascii=False: dict keys in insertion order, no
// HTML escaping), Python's str methods (strip/split on Unicode whitespace), and the
// `raise_exception(msg)` and `strftime_now(fmt)` globals. See jinja_*.h for the syntax.
//
// Limits: rendering is bounded in loop iterations, macro recursion, nesting depth and output
// size, so no template or input can hang or crash the caller; hitting a limit is an error.
//
// Thread safety: a parsed ChatTemplate is immutable; Render is const and safe to call from any
// number of threads concurrently. Copies share the parsed program.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace pdserve {

namespace jinja {
struct Program;
}  // namespace jinja

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  std::string bos_token, eos_token;
  // More template variables, e.g. {"tools": [...], "enable_thinking": false}. Must be an object.
  // Keys named messages/add_generation_prompt/bos_token/eos_token are overridden by the above.
  // Ordered: objects keep the caller's key order, so `tojson` prints them as Python does.
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  // The clock of `strftime_now` (Unix seconds, formatted in UTC). Unset: the system clock.
  // Tests set it to get a fixed date.
  std::optional<int64_t> now_unix_seconds;
};

class ChatTemplate {
 public:
  // Syntax errors -> InvalidArgument "chat template line L col C: ...".
  static Result<ChatTemplate> Parse(std::string source);

  // `messages` is the OpenAI-style list of {"role", "content", ...} objects, keys in the
  // caller's order (a nlohmann::json argument converts, keys then sorted). Errors from the
  // template (undefined filter, type error, raise_exception('...'), a limit) -> InvalidArgument
  // carrying the template's message.
  Result<std::string> Render(const nlohmann::ordered_json& messages,
                             const ChatRenderOptions& options) const;

  // For a model without a `chat_template`: bos_token, then every message as
  // "<role>: <content>\n\n" (content parts of type text are concatenated), then "assistant:"
  // when add_generation_prompt. Plain text, so any tokenizer can encode it; no special tokens.
  static ChatTemplate Fallback();
  static const char kFallbackSource[];

  const std::string& source() const;

 private:
  explicit ChatTemplate(std::shared_ptr<const jinja::Program> program)
      : program_(std::move(program)) {}

  std::shared_ptr<const jinja::Program> program_;
};

}  // namespace pdserve
