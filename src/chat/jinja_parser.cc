#include "chat/jinja_parser.h"

#include <algorithm>
#include <initializer_list>
#include <string_view>
#include <utility>
#include <vector>

#include "chat/jinja_lexer.h"

namespace pdserve::jinja {
namespace {

using Type = Token::Type;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  Result<StmtList> ParseTop() {
    std::string end;
    PD_ASSIGN_OR_RETURN(StmtList body, ParseBody({}, &end));
    return body;
  }

 private:
  // Guards recursion: hostile nesting becomes an error, not a stack overflow.
  class DepthGuard {
   public:
    explicit DepthGuard(int* depth) : depth_(depth) { ++*depth_; }
    ~DepthGuard() { --*depth_; }
    DepthGuard(const DepthGuard&) = delete;
    DepthGuard& operator=(const DepthGuard&) = delete;
    bool too_deep() const { return *depth_ > kMaxParseDepth; }

   private:
    int* depth_;
  };

  const Token& Peek(size_t ahead = 0) const {
    size_t i = pos_ + ahead;
    return i < toks_.size() ? toks_[i] : toks_.back();
  }
  const Token& Next() {
    const Token& t = Peek();
    if (pos_ < toks_.size() - 1) ++pos_;
    return t;
  }
  bool IsOp(std::string_view op, size_t ahead = 0) const {
    return Peek(ahead).type == Type::kOp && Peek(ahead).text == op;
  }
  bool IsName(std::string_view name, size_t ahead = 0) const {
    return Peek(ahead).type == Type::kName && Peek(ahead).text == name;
  }
  bool AcceptOp(std::string_view op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  bool AcceptName(std::string_view name) {
    if (!IsName(name)) return false;
    Next();
    return true;
  }

  Status ErrorAt(const Token& t, const std::string& what) const {
    return Status::InvalidArgument("line " + std::to_string(t.line) + " col " +
                                   std::to_string(t.col) + ": " + what);
  }
  static std::string Describe(const Token& t) {
    switch (t.type) {
      case Type::kEof:
        return "end of template";
      case Type::kVarEnd:
        return "'}}'";
      case Type::kBlockEnd:
        return "'%}'";
      case Type::kString:
        return "string literal";
      case Type::kInt:
      case Type::kFloat:
        return "number";
      default:
        return "'" + t.text + "'";
    }
  }
  Status Expect(Type type, const char* what) {
    if (Peek().type != type)
      return ErrorAt(Peek(), std::string("expected ") + what + ", got " + Describe(Peek()));
    Next();
    return Status::Ok();
  }
  Status ExpectOp(std::string_view op) {
    if (!AcceptOp(op)) {
      return ErrorAt(Peek(), "expected '" + std::string(op) + "', got " + Describe(Peek()));
    }
    return Status::Ok();
  }
  Result<std::string> ExpectName() {
    if (Peek().type != Type::kName) {
      return ErrorAt(Peek(), "expected a name, got " + Describe(Peek()));
    }
    return Next().text;
  }

  ExprPtr MakeExpr(Expr::Kind kind, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = at.line;
    e->col = at.col;
    return e;
  }
  StmtPtr MakeStmt(Stmt::Kind kind, const Token& at) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = at.line;
    s->col = at.col;
    return s;
  }

  // ---- statements ----

  // Parses until a `{% <one of end_tags>` (consumed up to and including the tag name, which is
  // stored in *found) or, with no end tags, until the end of the template.
  Result<StmtList> ParseBody(std::initializer_list<std::string_view> end_tags, std::string* found) {
    StmtList body;
    while (true) {
      const Token& t = Peek();
      if (t.type == Type::kEof) {
        if (end_tags.size() == 0) return body;
        return ErrorAt(t, "unexpected end of template, expected '{% " +
                              std::string(*end_tags.begin()) + " %}'");
      }
      if (t.type == Type::kText) {
        auto s = MakeStmt(Stmt::Kind::kText, t);
        s->text = Next().text;
        body.push_back(std::move(s));
      } else if (t.type == Type::kVarBegin) {
        const Token& begin = Next();
        auto s = MakeStmt(Stmt::Kind::kOutput, begin);
        PD_ASSIGN_OR_RETURN(s->expr, ParseExpression(true));
        PD_RETURN_IF_ERROR(Expect(Type::kVarEnd, "'}}'"));
        body.push_back(std::move(s));
      } else if (t.type == Type::kBlockBegin) {
        const Token& name = Peek(1);
        for (std::string_view end : end_tags) {
          if (name.type == Type::kName && name.text == end) {
            Next();
            *found = Next().text;
            return body;
          }
        }
        PD_ASSIGN_OR_RETURN(StmtPtr s, ParseStatement());
        if (s) body.push_back(std::move(s));
      } else {
        return ErrorAt(t, "unexpected " + Describe(t));
      }
    }
  }

  Result<StmtPtr> ParseStatement() {
    DepthGuard guard(&depth_);
    const Token& begin = Next();  // {%
    if (guard.too_deep()) return ErrorAt(begin, "blocks nested too deeply");
    if (Peek().type != Type::kName) return ErrorAt(Peek(), "expected a tag name");
    const Token& tag = Next();
    const std::string& name = tag.text;
    if (name == "if") return ParseIf(tag);
    if (name == "for") return ParseFor(tag);
    if (name == "set") return ParseSet(tag);
    if (name == "macro") return ParseMacro(tag);
    if (name == "break" || name == "continue") {
      auto s = MakeStmt(name == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue, tag);
      PD_RETURN_IF_ERROR(Expect(Type::kBlockEnd, "'%}'"));
      return s;
    }
    if (name == "generation") {
      // Hugging Face's assistant-mask marker: renders its body unchanged.
      auto s = MakeStmt(Stmt::Kind::kBody, tag);
      PD_RETURN_IF_ERROR(Expect(Type::kBlockEnd, "'%}'"));
      std::string end;
      PD_ASSIGN_OR_RETURN(s->body, ParseBody({"endgeneration"}, &end));
      PD_RETURN_IF_ERROR(Expect(Type::kBlockEnd, "'%}'"));
      return s;
    }
    return ErrorAt(tag, "unknown or unexpected tag '" + name + "'");
  }

  Result<StmtPtr> ParseIf(const Token& tag) {
    auto s = MakeStmt(Stmt::Kind::kIf, tag);
    PD_ASSIGN_OR_RETURN(ExprPtr cond, ParseExpression(true));
    while (true) {
      PD_RETURN_IF_ERROR(Expect(Type::kBlockEnd, "'%}'"));
      std::string end;
      PD_ASSIGN_OR_RETURN(StmtList body, ParseBody({"elif", "else", "endif"}, &end));
      s->branches.emplace_back(std::move(cond), std::move(body));
      if (end == "endif") break;
      if (end == "else") {
        PD_RETURN_IF_ERROR(Expect(Type::kBlockEnd, "'%}'"));
        PD_ASSIGN_OR_RETURN(StmtList else_body, ParseBody({"endif"}, &end));
        s->branches.emplace_back(nullptr, std::move(else_body));
        break;
      }
      PD_ASSIGN_OR_RETURN(cond, ParseExpression(true));  // elif
    }
    PD_RETURN_IF_ERROR(Expect(Type::kBlockEnd, "'%}'"));
    return s;
  }

  Result<StmtPtr> ParseFor(const Token& tag) {
    auto s = MakeStmt(Stmt::Kind::kFor, tag);
    bool parenthesized = AcceptOp("(");
    do {
      PD_ASSIGN_OR_RETURN(std::string target, ExpectName());
      s->targets.push_back(std::move(target));
    } while (AcceptOp(","));
    if (parenthesized) PD_RETURN_IF_ERROR(ExpectOp(")"));
    if (!AcceptName("in")) return ErrorAt(Peek(), "expected 'in' in for loop");
    // No conditional expression here: `for x in xs if cond` filters the loop.
    PD_ASSIGN_OR_RETURN(s->expr, ParseExpression(false));
    if (AcceptName("if")) {
      PD_ASSIGN_OR_RETURN(s->filter, ParseExpression(false));
    }
    if (IsName("recursive")) return ErrorAt(Peek(), "recursive loops are not supported");
    PD_RETURN_IF_ERROR(Expect(Type::kBlockEnd, "'%}'"));
    std::string end;
    PD_ASSIGN_OR_RETURN(s->body, ParseBody({"else", "endfor"}, &end));
    if (end == "else") {
      PD_RETURN_IF_ERROR(Expect(Type::kBlockEnd, "'%}'"));
      PD_ASSIGN_OR_RETURN(s->else_body, ParseBody({"endfor"}, &end));
    }
    PD_RETURN_IF_ERROR(Expect(Type::kBlockEnd, "'%}'"));
    return s;
  }

  Result<StmtPtr> ParseSet(const Token& tag) {
    auto s = MakeStmt(Stmt::Kind::kSet, tag);
    PD_ASSIGN_OR_RETURN(std::string target, ExpectName());
    s->targets.push_back(std::move(target));
    if (AcceptOp(".")) {
      PD_ASSIGN_OR_RETURN(std::string attr, ExpectName());
      s->targets.push_back(std::move(attr));
    }
    if (AcceptOp("=")) {
      PD_ASSIGN_OR_RETURN(s->expr, ParseTupleOrExpression());
      PD_RETURN_IF_ERROR(Expect(Type::kBlockEnd, "'%}'"));
      return s;
    }
    if (s->targets.size() != 1) return ErrorAt(Peek(), "expected '=' after set target");
    PD_RETURN_IF_ERROR(Expect(Type::kBlockEnd, "'=' or '%}'"));
    s->kind = Stmt::Kind::kSetBlock;
    std::string end;
    PD_ASSIGN_OR_RETURN(s->body, ParseBody({"endset"}, &end));
    PD_RETURN_IF_ERROR(Expect(Type::kBlockEnd, "'%}'"));
    return s;
  }

  Result<StmtPtr> ParseMacro(const Token& tag) {
    auto s = MakeStmt(Stmt::Kind::kMacro, tag);
    PD_ASSIGN_OR_RETURN(std::string name, ExpectName());
    s->targets.push_back(std::move(name));
    PD_RETURN_IF_ERROR(ExpectOp("("));
    while (!AcceptOp(")")) {
      PD_ASSIGN_OR_RETURN(std::string param, ExpectName());
      ExprPtr default_value;
      if (AcceptOp("=")) {
        PD_ASSIGN_OR_RETURN(default_value, ParseExpression(true));
      }
      s->params.emplace_back(std::move(param), std::move(default_value));
      if (!AcceptOp(",")) {
        PD_RETURN_IF_ERROR(ExpectOp(")"));
        break;
      }
    }
    PD_RETURN_IF_ERROR(Expect(Type::kBlockEnd, "'%}'"));
    std::string end;
    PD_ASSIGN_OR_RETURN(s->body, ParseBody({"endmacro"}, &end));
    if (Peek().type == Type::kName) Next();  // {% endmacro name %}
    PD_RETURN_IF_ERROR(Expect(Type::kBlockEnd, "'%}'"));
    return s;
  }

  // ---- expressions ----

  // `a, b` (a tuple without parentheses) as in `set x = 1, 2`.
  Result<ExprPtr> ParseTupleOrExpression() {
    const Token& at = Peek();
    PD_ASSIGN_OR_RETURN(ExprPtr first, ParseExpression(true));
    if (!IsOp(",")) return first;
    auto tuple = MakeExpr(Expr::Kind::kTuple, at);
    tuple->args.push_back(std::move(first));
    while (AcceptOp(",")) {
      if (Peek().type == Type::kBlockEnd) break;
      PD_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(true));
      tuple->args.push_back(std::move(item));
    }
    return Sealed(std::move(tuple));
  }

  Result<ExprPtr> ParseExpression(bool allow_conditional) {
    DepthGuard guard(&depth_);
    if (guard.too_deep()) return ErrorAt(Peek(), "expression nested too deeply");
    const Token& at = Peek();
    PD_ASSIGN_OR_RETURN(ExprPtr value, ParseOr());
    if (!allow_conditional || !AcceptName("if")) return value;
    auto cond = MakeExpr(Expr::Kind::kCond, at);
    cond->args.push_back(std::move(value));
    PD_ASSIGN_OR_RETURN(ExprPtr test, ParseOr());
    cond->args.push_back(std::move(test));
    ExprPtr otherwise;
    if (AcceptName("else")) {
      PD_ASSIGN_OR_RETURN(otherwise, ParseExpression(true));
    }
    cond->args.push_back(std::move(otherwise));
    return Sealed(std::move(cond));
  }

  Result<ExprPtr> Binary(Expr::Kind kind, const Token& at, std::string op, ExprPtr a, ExprPtr b) {
    auto e = MakeExpr(kind, at);
    e->name = std::move(op);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return Sealed(std::move(e));
  }

  // Records the depth of a node whose children are complete. Iteratively built chains
  // ("a + a + ...", "x.y.y.y...") would otherwise make trees deep enough to overflow the stack
  // when evaluated or destroyed.
  Result<ExprPtr> Sealed(ExprPtr e) {
    int depth = 0;
    for (const ExprPtr& arg : e->args) {
      if (arg) depth = std::max(depth, arg->depth);
    }
    for (const auto& [name, value] : e->kwargs) depth = std::max(depth, value->depth);
    e->depth = depth + 1;
    if (e->depth > kMaxExprDepth) {
      return Status::InvalidArgument("line " + std::to_string(e->line) + " col " +
                                     std::to_string(e->col) + ": expression nested too deeply");
    }
    return e;
  }

  Result<ExprPtr> ParseOr() {
    PD_ASSIGN_OR_RETURN(ExprPtr left, ParseAnd());
    while (IsName("or")) {
      const Token& at = Next();
      PD_ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
      PD_ASSIGN_OR_RETURN(left,
                          Binary(Expr::Kind::kOr, at, "or", std::move(left), std::move(right)));
    }
    return left;
  }

  Result<ExprPtr> ParseAnd() {
    PD_ASSIGN_OR_RETURN(ExprPtr left, ParseNot());
    while (IsName("and")) {
      const Token& at = Next();
      PD_ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
      PD_ASSIGN_OR_RETURN(left,
                          Binary(Expr::Kind::kAnd, at, "and", std::move(left), std::move(right)));
    }
    return left;
  }

  Result<ExprPtr> ParseNot() {
    if (!IsName("not")) return ParseCompare();
    DepthGuard guard(&depth_);
    const Token& at = Next();
    if (guard.too_deep()) return ErrorAt(at, "expression nested too deeply");
    auto e = MakeExpr(Expr::Kind::kNot, at);
    PD_ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
    e->args.push_back(std::move(operand));
    return Sealed(std::move(e));
  }

  Result<ExprPtr> ParseCompare() {
    PD_ASSIGN_OR_RETURN(ExprPtr left, ParseMath1());
    while (true) {
      const Token& at = Peek();
      std::string op;
      if (at.type == Type::kOp && (at.text == "==" || at.text == "!=" || at.text == "<" ||
                                   at.text == ">" || at.text == "<=" || at.text == ">=")) {
        op = Next().text;
      } else if (IsName("in")) {
        Next();
        op = "in";
      } else if (IsName("not") && IsName("in", 1)) {
        Next();
        Next();
        op = "notin";
      } else {
        return left;
      }
      PD_ASSIGN_OR_RETURN(ExprPtr right, ParseMath1());
      PD_ASSIGN_OR_RETURN(left,
                          Binary(Expr::Kind::kBinary, at, op, std::move(left), std::move(right)));
    }
  }

  // One precedence level of left-associative binary operators.
  template <typename Fn>
  Result<ExprPtr> ParseBinaryLevel(std::initializer_list<std::string_view> ops, Fn next) {
    PD_ASSIGN_OR_RETURN(ExprPtr left, next());
    while (true) {
      const Token& at = Peek();
      bool match = false;
      for (std::string_view op : ops) match = match || IsOp(op);
      if (!match) return left;
      std::string op = Next().text;
      PD_ASSIGN_OR_RETURN(ExprPtr right, next());
      PD_ASSIGN_OR_RETURN(left,
                          Binary(Expr::Kind::kBinary, at, op, std::move(left), std::move(right)));
    }
  }

  Result<ExprPtr> ParseMath1() {
    return ParseBinaryLevel({"+", "-"}, [this] { return ParseConcat(); });
  }
  Result<ExprPtr> ParseConcat() {
    return ParseBinaryLevel({"~"}, [this] { return ParseMath2(); });
  }
  Result<ExprPtr> ParseMath2() {
    return ParseBinaryLevel({"*", "/", "//", "%"}, [this] { return ParsePow(); });
  }
  Result<ExprPtr> ParsePow() {
    return ParseBinaryLevel({"**"}, [this] { return ParseUnary(); });
  }

  // As Jinja: a sign applies to the operand before filters, so `-3|abs` is abs(-3).
  Result<ExprPtr> ParseUnary(bool with_filters = true) {
    DepthGuard guard(&depth_);
    if (guard.too_deep()) return ErrorAt(Peek(), "expression nested too deeply");
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      const Token& at = Next();
      PD_ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
      if (at.text == "+") {
        node = std::move(operand);
      } else {
        node = MakeExpr(Expr::Kind::kNeg, at);
        node->args.push_back(std::move(operand));
        PD_ASSIGN_OR_RETURN(node, Sealed(std::move(node)));
      }
    } else {
      PD_ASSIGN_OR_RETURN(node, ParsePrimary());
    }
    PD_ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
    if (!with_filters) return node;
    return ParseFiltersAndTests(std::move(node));
  }

  Result<ExprPtr> ParsePrimary() {
    const Token& t = Peek();
    switch (t.type) {
      case Type::kString: {
        auto e = MakeExpr(Expr::Kind::kLiteral, t);
        std::string value;
        while (Peek().type == Type::kString) value += Next().text;  // "a" "b" concatenates
        e->literal = Value::String(std::move(value));
        return e;
      }
      case Type::kInt: {
        auto e = MakeExpr(Expr::Kind::kLiteral, t);
        e->literal = Value::Int(Next().int_value);
        return e;
      }
      case Type::kFloat: {
        auto e = MakeExpr(Expr::Kind::kLiteral, t);
        e->literal = Value::Float(Next().float_value);
        return e;
      }
      case Type::kName: {
        auto e = MakeExpr(Expr::Kind::kLiteral, t);
        const std::string& n = Next().text;
        if (n == "true" || n == "True") {
          e->literal = Value::Bool(true);
        } else if (n == "false" || n == "False") {
          e->literal = Value::Bool(false);
        } else if (n == "none" || n == "None") {
          e->literal = Value::None();
        } else {
          e->kind = Expr::Kind::kName;
          e->name = n;
        }
        return e;
      }
      case Type::kOp:
        if (t.text == "(") return ParseParenthesized();
        if (t.text == "[") return ParseList();
        if (t.text == "{") return ParseDict();
        break;
      default:
        break;
    }
    return ErrorAt(t, "unexpected " + Describe(t) + " in expression");
  }

  Result<ExprPtr> ParseParenthesized() {
    const Token& at = Next();  // (
    auto tuple = MakeExpr(Expr::Kind::kTuple, at);
    if (AcceptOp(")")) return tuple;
    PD_ASSIGN_OR_RETURN(ExprPtr first, ParseExpression(true));
    if (AcceptOp(")")) return first;
    tuple->args.push_back(std::move(first));
    while (AcceptOp(",")) {
      if (IsOp(")")) break;
      PD_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(true));
      tuple->args.push_back(std::move(item));
    }
    PD_RETURN_IF_ERROR(ExpectOp(")"));
    return Sealed(std::move(tuple));
  }

  Result<ExprPtr> ParseList() {
    const Token& at = Next();  // [
    auto list = MakeExpr(Expr::Kind::kList, at);
    while (!AcceptOp("]")) {
      PD_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(true));
      list->args.push_back(std::move(item));
      if (!AcceptOp(",")) {
        PD_RETURN_IF_ERROR(ExpectOp("]"));
        break;
      }
    }
    return Sealed(std::move(list));
  }

  Result<ExprPtr> ParseDict() {
    const Token& at = Next();  // {
    auto dict = MakeExpr(Expr::Kind::kDict, at);
    while (!AcceptOp("}")) {
      PD_ASSIGN_OR_RETURN(ExprPtr key, ParseExpression(true));
      PD_RETURN_IF_ERROR(ExpectOp(":"));
      PD_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
      dict->args.push_back(std::move(key));
      dict->args.push_back(std::move(value));
      if (!AcceptOp(",")) {
        PD_RETURN_IF_ERROR(ExpectOp("}"));
        break;
      }
    }
    return Sealed(std::move(dict));
  }

  Result<ExprPtr> ParsePostfix(ExprPtr value) {
    while (true) {
      const Token& at = Peek();
      if (AcceptOp(".")) {
        auto e = MakeExpr(Expr::Kind::kAttr, at);
        if (Peek().type == Type::kInt) {
          e->kind = Expr::Kind::kItem;  // x.0 is x[0]
          e->args.push_back(std::move(value));
          auto index = MakeExpr(Expr::Kind::kLiteral, Peek());
          index->literal = Value::Int(Next().int_value);
          e->args.push_back(std::move(index));
        } else {
          PD_ASSIGN_OR_RETURN(e->name, ExpectName());
          e->args.push_back(std::move(value));
        }
        PD_ASSIGN_OR_RETURN(value, Sealed(std::move(e)));
      } else if (IsOp("[")) {
        PD_ASSIGN_OR_RETURN(value, ParseSubscript(std::move(value)));
      } else if (IsOp("(")) {
        auto call = MakeExpr(Expr::Kind::kCall, at);
        call->args.push_back(std::move(value));
        PD_RETURN_IF_ERROR(ParseArgs(call.get()));
        PD_ASSIGN_OR_RETURN(value, Sealed(std::move(call)));
      } else {
        return value;
      }
    }
  }

  Result<ExprPtr> ParseSubscript(ExprPtr value) {
    const Token& at = Next();  // [
    ExprPtr start, stop, step;
    if (!IsOp(":")) {
      PD_ASSIGN_OR_RETURN(start, ParseExpression(true));
    }
    if (AcceptOp("]")) {
      if (!start) return ErrorAt(at, "empty subscript");
      auto e = MakeExpr(Expr::Kind::kItem, at);
      e->args.push_back(std::move(value));
      e->args.push_back(std::move(start));
      return Sealed(std::move(e));
    }
    PD_RETURN_IF_ERROR(ExpectOp(":"));
    if (!IsOp(":") && !IsOp("]")) {
      PD_ASSIGN_OR_RETURN(stop, ParseExpression(true));
    }
    if (AcceptOp(":") && !IsOp("]")) {
      PD_ASSIGN_OR_RETURN(step, ParseExpression(true));
    }
    PD_RETURN_IF_ERROR(ExpectOp("]"));
    auto e = MakeExpr(Expr::Kind::kSlice, at);
    e->args.push_back(std::move(value));
    e->args.push_back(std::move(start));
    e->args.push_back(std::move(stop));
    e->args.push_back(std::move(step));
    return Sealed(std::move(e));
  }

  // `(a, b, key=value)` appended to e->args / e->kwargs.
  Status ParseArgs(Expr* e) {
    PD_RETURN_IF_ERROR(ExpectOp("("));
    while (!AcceptOp(")")) {
      if (Peek().type == Type::kName && IsOp("=", 1)) {
        std::string key = Next().text;
        Next();  // =
        PD_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
        e->kwargs.emplace_back(std::move(key), std::move(value));
      } else {
        if (!e->kwargs.empty()) return ErrorAt(Peek(), "positional argument after keyword");
        PD_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
        e->args.push_back(std::move(value));
      }
      if (!AcceptOp(",")) return ExpectOp(")");
    }
    return Status::Ok();
  }

  Result<ExprPtr> ParseFiltersAndTests(ExprPtr value) {
    while (true) {
      const Token& at = Peek();
      if (AcceptOp("|")) {
        auto f = MakeExpr(Expr::Kind::kFilter, at);
        PD_ASSIGN_OR_RETURN(f->name, ExpectName());
        f->args.push_back(std::move(value));
        if (IsOp("(")) PD_RETURN_IF_ERROR(ParseArgs(f.get()));
        PD_ASSIGN_OR_RETURN(value, Sealed(std::move(f)));
      } else if (AcceptName("is")) {
        auto t = MakeExpr(Expr::Kind::kTest, at);
        t->negated = AcceptName("not");
        PD_ASSIGN_OR_RETURN(t->name, ExpectName());
        t->args.push_back(std::move(value));
        if (IsOp("(")) {
          PD_RETURN_IF_ERROR(ParseArgs(t.get()));
        } else if (TestArgumentFollows()) {
          PD_ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
          t->args.push_back(std::move(arg));
        }
        PD_ASSIGN_OR_RETURN(value, Sealed(std::move(t)));
      } else {
        return value;
      }
    }
  }

  // `x is divisibleby 3`, `x is sameas false`: a bare literal argument.
  bool TestArgumentFollows() const {
    const Token& t = Peek();
    if (t.type == Type::kString || t.type == Type::kInt || t.type == Type::kFloat) return true;
    if (t.type != Type::kName) return false;
    return t.text == "true" || t.text == "false" || t.text == "none" || t.text == "True" ||
           t.text == "False" || t.text == "None";
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

Result<std::shared_ptr<const Program>> ParseProgram(std::string source) {
  PD_ASSIGN_OR_RETURN(std::vector<Token> tokens, Tokenize(source));
  Parser parser(std::move(tokens));
  PD_ASSIGN_OR_RETURN(StmtList body, parser.ParseTop());
  auto program = std::make_shared<Program>();
  program->source = std::move(source);
  program->body = std::move(body);
  return std::shared_ptr<const Program>(std::move(program));
}

}  // namespace pdserve::jinja
