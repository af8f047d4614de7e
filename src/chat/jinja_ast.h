// The syntax tree of a parsed chat template, and the lexer's tokens. Immutable after parsing;
// shared read-only by every render (thread-safe to read).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/jinja_value.h"

namespace pdserve::jinja {

struct Token {
  enum class Type : uint8_t {
    kText,        // literal template text (whitespace control already applied)
    kVarBegin,    // {{
    kVarEnd,      // }}
    kBlockBegin,  // {%
    kBlockEnd,    // %}
    kName,
    kString,
    kInt,
    kFloat,
    kOp,  // operator or punctuation, in `text`
    kEof,
  };
  Type type = Type::kEof;
  std::string text;  // text, name, string value or operator
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1, col = 1;
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind : uint8_t {
    kLiteral,  // literal
    kName,     // name
    kAttr,     // args[0].name
    kItem,     // args[0][args[1]]
    kSlice,    // args[0][args[1]:args[2]:args[3]] (parts may be null)
    kCall,     // args[0](args[1..], kwargs)
    kFilter,   // args[0] | name(args[1..], kwargs)
    kTest,     // args[0] is [not] name(args[1..])
    kNot,      // not args[0]
    kNeg,      // -args[0]
    kBinary,   // args[0] name args[1]: + - ~ * / // % ** == != < > <= >= in notin
    kAnd,
    kOr,
    kCond,   // args[0] if args[1] else args[2] (else may be null)
    kList,   // [args...]
    kTuple,  // (args...)
    kDict,   // {args[0]: args[1], ...}
  };
  Kind kind = Kind::kLiteral;
  int line = 0, col = 0;
  int depth = 1;  // height of the subtree, bounded by the parser
  Value literal;
  std::string name;
  bool negated = false;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using StmtList = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind : uint8_t {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // branches (null condition = else)
    kFor,       // for targets in expr [if filter]: body [else else_body]
    kSet,       // set targets[0][.targets[1]] = expr
    kSetBlock,  // set targets[0] %}body{% endset
    kMacro,     // macro targets[0](params): body
    kBreak,
    kContinue,
    kBody,  // a plain body, e.g. {% generation %}...{% endgeneration %}
  };
  Kind kind = Kind::kText;
  int line = 0, col = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;
  std::vector<std::string> targets;
  std::vector<std::pair<ExprPtr, StmtList>> branches;
  StmtList body, else_body;
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro parameters with defaults
};

struct Program {
  std::string source;
  StmtList body;
};

}  // namespace pdserve::jinja
