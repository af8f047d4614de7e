// Lexer of the chat-template Jinja subset: splits a template into text and tag tokens, with
// Hugging Face's settings (trim_blocks, lstrip_blocks) and `{%- -%}` whitespace control
// applied, newlines normalised to \n and the template's trailing newline dropped, as Jinja's
// lexer does. Comments `{# #}` are dropped. Pure function; thread-safe.
#pragma once

#include <string_view>
#include <vector>

#include "chat/jinja_ast.h"
#include "common/status.h"

namespace pdserve::jinja {

// Errors: InvalidArgument "line L col C: ..." (unterminated tag, string or comment,
// unexpected character). The last token is kEof.
Result<std::vector<Token>> Tokenize(std::string_view source);

}  // namespace pdserve::jinja
