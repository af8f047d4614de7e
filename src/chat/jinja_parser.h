// Parser of the chat-template Jinja subset: tokens -> Program (statements and expressions).
//
// Statements: if/elif/else, for (tuple targets, `if` filter, else), set (name, ns.attr, block
// form), macro, break/continue, generation (rendered as its body). Expressions: literals
// (string, int, float, true/false/none, list, tuple, dict), names, attributes, subscripts and
// slices, calls with keyword arguments, filters and tests with arguments, not/and/or,
// comparisons, in / not in, + - * / // % ** ~, conditional expressions. Nesting is bounded, so
// hostile input cannot exhaust the stack. Pure function; thread-safe.
#pragma once

#include <memory>
#include <string>

#include "chat/jinja_ast.h"
#include "common/status.h"

namespace pdserve::jinja {

// Deepest nesting of expressions or blocks the parser accepts.
inline constexpr int kMaxParseDepth = 128;
// Deepest expression tree (chains of operators, attributes, filters count too).
inline constexpr int kMaxExprDepth = 256;

// Errors: InvalidArgument "line L col C: ...".
Result<std::shared_ptr<const Program>> ParseProgram(std::string source);

}  // namespace pdserve::jinja
