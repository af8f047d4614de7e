#include "chat/jinja_eval.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "chat/jinja_builtins.h"

namespace pdserve::jinja {
namespace {

// raise_exception() travels as kCancelled so that no position prefix is added to the
// template's own message; Render turns it into InvalidArgument.
bool IsRaised(const Status& s) { return s.code() == StatusCode::kCancelled; }

bool HasPosition(const Status& s) { return s.message().rfind("line ", 0) == 0; }

Status WithPosition(Status s, int line, int col) {
  if (s.ok() || IsRaised(s) || HasPosition(s)) return s;
  return ErrorAt(line, col, s.message());
}

Result<Value> TypeError(std::string_view op, const Value& a, const Value& b) {
  return Status::InvalidArgument("unsupported operand types for " + std::string(op) + ": '" +
                                 std::string(a.TypeName()) + "' and '" + std::string(b.TypeName()) +
                                 "'");
}

Status UndefinedError(const Value& v) {
  if (v.undefined_name().empty()) return Status::InvalidArgument("value is undefined");
  return Status::InvalidArgument("'" + v.undefined_name() + "' is undefined");
}

// Python's floor division and modulo on integers.
int64_t FloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

Result<Value> Arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (!a.is_number() && a.kind() != Value::Kind::kBool) return TypeError(op, a, b);
  if (!b.is_number() && b.kind() != Value::Kind::kBool) return TypeError(op, a, b);
  bool ints = a.kind() != Value::Kind::kFloat && b.kind() != Value::Kind::kFloat;
  if (ints && op != "/" && op != "**") {
    int64_t x = a.as_int(), y = b.as_int(), r = 0;
    bool overflow = false;
    if (op == "+") {
      overflow = __builtin_add_overflow(x, y, &r);
    } else if (op == "-") {
      overflow = __builtin_sub_overflow(x, y, &r);
    } else if (op == "*") {
      overflow = __builtin_mul_overflow(x, y, &r);
    } else {
      if (y == 0) return Status::InvalidArgument("division by zero");
      if (x == std::numeric_limits<int64_t>::min() && y == -1) return Value::Float(-double(x));
      r = op == "//" ? FloorDiv(x, y) : x - FloorDiv(x, y) * y;
    }
    if (overflow) return Status::InvalidArgument("integer overflow in '" + op + "'");
    return Value::Int(r);
  }
  double x = a.as_double(), y = b.as_double();
  if (op == "+") return Value::Float(x + y);
  if (op == "-") return Value::Float(x - y);
  if (op == "*") return Value::Float(x * y);
  if (op == "**") {
    double r = std::pow(x, y);
    if (ints && b.as_int() >= 0 && std::fabs(r) < 9.2e18) return Value::Int(int64_t(r));
    return Value::Float(r);
  }
  if (y == 0) return Status::InvalidArgument("division by zero");
  if (op == "/") return Value::Float(x / y);
  double q = std::floor(x / y);
  if (op == "//") return Value::Float(q);
  return Value::Float(x - q * y);
}

Result<bool> Less(const Value& a, const Value& b) {
  if ((a.is_number() || a.kind() == Value::Kind::kBool) &&
      (b.is_number() || b.kind() == Value::Kind::kBool)) {
    return a.as_double() < b.as_double();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  return Status::InvalidArgument("cannot compare '" + std::string(a.TypeName()) + "' with '" +
                                 std::string(b.TypeName()) + "'");
}

Result<bool> Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kString:
      if (!item.is_string()) return Status::InvalidArgument("'in <string>' needs a string");
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& v : container.list()) {
        if (v.Equals(item)) return true;
      }
      return false;
    case Value::Kind::kDict:
    case Value::Kind::kNamespace:
      return item.is_string() && container.Find(item.as_string()) != nullptr;
    case Value::Kind::kUndefined:
      return false;
    default:
      return Status::InvalidArgument("argument of type '" + std::string(container.TypeName()) +
                                     "' is not iterable");
  }
}

}  // namespace

Status ErrorAt(int line, int col, const std::string& what) {
  return Status::InvalidArgument("line " + std::to_string(line) + " col " + std::to_string(col) +
                                 ": " + what);
}

const Value* CallArgs::Get(size_t index, std::string_view name) const {
  if (index < positional.size()) return &positional[index];
  for (const auto& [k, v] : keyword) {
    if (k == name) return &v;
  }
  return nullptr;
}

const Value* Evaluator::Frame::Find(const std::string& name) const {
  for (const auto& [k, v] : vars) {
    if (k == name) return &v;
  }
  return nullptr;
}

void Evaluator::Frame::Set(const std::string& name, Value value) {
  for (auto& [k, v] : vars) {
    if (k == name) {
      v = std::move(value);
      return;
    }
  }
  vars.emplace_back(name, std::move(value));
}

Status Evaluator::Tick(int64_t steps) {
  steps_ += steps;
  if (steps_ > limits_.max_steps) {
    return Status::InvalidArgument("template exceeded " + std::to_string(limits_.max_steps) +
                                   " steps (loop iterations and calls)");
  }
  return Status::Ok();
}

Status Evaluator::CheckDepth(const Value& value) const {
  if (value.depth() > limits_.max_value_depth) {
    return Status::InvalidArgument("lists/dicts nested deeper than " +
                                   std::to_string(limits_.max_value_depth));
  }
  return Status::Ok();
}

Status Evaluator::CheckSize(size_t bytes) const {
  if (bytes > limits_.max_output_bytes) {
    return Status::InvalidArgument("template output exceeds " +
                                   std::to_string(limits_.max_output_bytes) + " bytes");
  }
  return Status::Ok();
}

Evaluator::~Evaluator() {
  for (const Value& ns : assigned_namespaces_) ns.mutable_namespace().clear();
}

Result<std::string> Evaluator::Render(const Program& program, ValueDict context) {
  frames_.clear();
  steps_ = 0;
  call_depth_ = 0;
  frames_.emplace_back();
  for (auto& [k, v] : context) frames_.back().Set(k, std::move(v));
  std::string out;
  Flow flow = Flow::kNormal;
  Status s = Exec(program.body, &out, &flow);
  if (IsRaised(s)) return Status::InvalidArgument(s.message());
  if (!s.ok()) return s;
  return out;
}

Value Evaluator::Lookup(const std::string& name) const {
  for (size_t i = frames_.size(); i-- > 0;) {
    if (const Value* v = frames_[i].Find(name)) return *v;
    if (frames_[i].barrier) {
      if (const Value* root = frames_[0].Find(name)) return *root;
      break;
    }
  }
  if (IsGlobalFunction(name)) {
    Callable c;
    c.kind = Callable::Kind::kGlobal;
    c.name = name;
    return Value::Function(std::move(c));
  }
  return Value::Undefined(name);
}

Status Evaluator::Exec(const StmtList& body, std::string* out, Flow* flow) {
  for (const StmtPtr& stmt : body) {
    PD_RETURN_IF_ERROR(WithPosition(ExecStmt(*stmt, out, flow), stmt->line, stmt->col));
    if (*flow != Flow::kNormal) return Status::Ok();
  }
  return Status::Ok();
}

Status Evaluator::ExecStmt(const Stmt& stmt, std::string* out, Flow* flow) {
  switch (stmt.kind) {
    case Stmt::Kind::kText:
      *out += stmt.text;
      return CheckSize(out->size());
    case Stmt::Kind::kOutput: {
      PD_ASSIGN_OR_RETURN(Value v, Eval(*stmt.expr));
      *out += v.ToString();
      return CheckSize(out->size());
    }
    case Stmt::Kind::kIf:
      for (const auto& [cond, body] : stmt.branches) {
        bool take = cond == nullptr;
        if (!take) {
          PD_ASSIGN_OR_RETURN(Value c, Eval(*cond));
          take = c.Truthy();
        }
        if (take) return Exec(body, out, flow);
      }
      return Status::Ok();
    case Stmt::Kind::kFor:
      return ExecFor(stmt, out);
    case Stmt::Kind::kSet:
    case Stmt::Kind::kSetBlock:
      return ExecSet(stmt, out);
    case Stmt::Kind::kMacro: {
      Callable c;
      c.kind = Callable::Kind::kMacro;
      c.name = stmt.targets[0];
      c.macro = &stmt;
      frames_.back().Set(stmt.targets[0], Value::Function(std::move(c)));
      return Status::Ok();
    }
    case Stmt::Kind::kBreak:
      *flow = Flow::kBreak;
      return Status::Ok();
    case Stmt::Kind::kContinue:
      *flow = Flow::kContinue;
      return Status::Ok();
    case Stmt::Kind::kBody:
      return Exec(stmt.body, out, flow);
  }
  return Status::Ok();
}

Status Evaluator::BindTargets(const Stmt& stmt, const Value& item, Frame* frame) {
  if (stmt.targets.size() == 1) {
    frame->Set(stmt.targets[0], item);
    return Status::Ok();
  }
  if (!item.is_list() || item.list().size() != stmt.targets.size()) {
    return Status::InvalidArgument("cannot unpack " + std::string(item.TypeName()) + " into " +
                                   std::to_string(stmt.targets.size()) + " loop variables");
  }
  for (size_t i = 0; i < stmt.targets.size(); ++i) frame->Set(stmt.targets[i], item.list()[i]);
  return Status::Ok();
}

Status Evaluator::ExecFor(const Stmt& stmt, std::string* out) {
  PD_ASSIGN_OR_RETURN(Value iterable, Eval(*stmt.expr));
  ValueList owned;  // items of a dict or string; a list is iterated in place
  const ValueList* items_ptr = &owned;
  ValueList& items = owned;
  switch (iterable.kind()) {
    case Value::Kind::kList:
      items_ptr = &iterable.list();
      break;
    case Value::Kind::kDict:
      for (const auto& [k, v] : iterable.dict()) items.push_back(Value::String(k));
      break;
    case Value::Kind::kString: {
      const std::string& s = iterable.as_string();
      std::vector<size_t> offsets = CodePointOffsets(s);
      for (size_t i = 0; i + 1 < offsets.size(); ++i) {
        items.push_back(Value::String(s.substr(offsets[i], offsets[i + 1] - offsets[i])));
      }
      break;
    }
    case Value::Kind::kUndefined:
      break;
    default:
      return Status::InvalidArgument("'" + std::string(iterable.TypeName()) +
                                     "' object is not iterable");
  }
  if (stmt.filter) {
    ValueList kept;
    for (const Value& item : *items_ptr) {
      PD_RETURN_IF_ERROR(Tick());
      frames_.emplace_back();
      Status s = BindTargets(stmt, item, &frames_.back());
      Result<Value> keep = s.ok() ? Eval(*stmt.filter) : Result<Value>(s);
      frames_.pop_back();
      if (!keep.ok()) return keep.status();
      if (keep->Truthy()) kept.push_back(item);
    }
    owned = std::move(kept);
    items_ptr = &owned;
  }
  const ValueList& list = *items_ptr;
  const int64_t n = static_cast<int64_t>(list.size());
  for (int64_t i = 0; i < n; ++i) {
    PD_RETURN_IF_ERROR(Tick());
    frames_.emplace_back();
    Frame& frame = frames_.back();
    ValueDict loop = {
        {"index0", Value::Int(i)},
        {"index", Value::Int(i + 1)},
        {"revindex0", Value::Int(n - i - 1)},
        {"revindex", Value::Int(n - i)},
        {"first", Value::Bool(i == 0)},
        {"last", Value::Bool(i == n - 1)},
        {"length", Value::Int(n)},
        {"previtem", i > 0 ? list[i - 1] : Value::Undefined("previtem")},
        {"nextitem", i + 1 < n ? list[i + 1] : Value::Undefined("nextitem")},
    };
    frame.Set("loop", Value::Dict(std::move(loop)));
    Status s = BindTargets(stmt, list[i], &frame);
    Flow flow = Flow::kNormal;
    if (s.ok()) s = Exec(stmt.body, out, &flow);
    frames_.pop_back();
    PD_RETURN_IF_ERROR(s);
    if (flow == Flow::kBreak) break;
  }
  if (n == 0 && !stmt.else_body.empty()) {
    Flow flow = Flow::kNormal;
    return Exec(stmt.else_body, out, &flow);
  }
  return Status::Ok();
}

Status Evaluator::ExecSet(const Stmt& stmt, std::string* out) {
  (void)out;
  Value value;
  if (stmt.kind == Stmt::Kind::kSetBlock) {
    std::string captured;
    Flow flow = Flow::kNormal;
    PD_RETURN_IF_ERROR(Exec(stmt.body, &captured, &flow));
    value = Value::String(std::move(captured));
  } else {
    PD_ASSIGN_OR_RETURN(value, Eval(*stmt.expr));
  }
  if (stmt.targets.size() == 1) {
    frames_.back().Set(stmt.targets[0], std::move(value));
    return Status::Ok();
  }
  Value ns = Lookup(stmt.targets[0]);
  if (ns.kind() != Value::Kind::kNamespace) {
    return Status::InvalidArgument("cannot assign attribute '" + stmt.targets[1] + "' on '" +
                                   stmt.targets[0] + "' (" + std::string(ns.TypeName()) +
                                   "); only namespace() objects have assignable attributes");
  }
  ValueDict& attrs = ns.mutable_namespace();
  if (assigned_seen_.insert(&attrs).second) assigned_namespaces_.push_back(ns);
  for (auto& [k, v] : attrs) {
    if (k == stmt.targets[1]) {
      v = std::move(value);
      return Status::Ok();
    }
  }
  attrs.emplace_back(stmt.targets[1], std::move(value));
  return Status::Ok();
}

Result<Value> Evaluator::GetAttr(const Value& object, const std::string& name) {
  if (object.is_undefined()) return UndefinedError(object);
  if (object.kind() == Value::Kind::kDict && HasMethod(object, name)) {
    Callable c;
    c.kind = Callable::Kind::kMethod;
    c.name = name;
    c.self = std::make_shared<const Value>(object);
    return Value::Function(std::move(c));
  }
  if (object.is_mapping()) {
    const Value* v = object.Find(name);
    return v ? *v : Value::Undefined(name);
  }
  if (HasMethod(object, name)) {
    Callable c;
    c.kind = Callable::Kind::kMethod;
    c.name = name;
    c.self = std::make_shared<const Value>(object);
    return Value::Function(std::move(c));
  }
  return Value::Undefined(name);
}

Result<Value> Evaluator::GetItem(const Value& object, const Value& key) {
  if (object.is_undefined()) return UndefinedError(object);
  if (object.is_mapping()) {
    if (!key.is_string()) return Value::Undefined(key.ToString());
    const Value* v = object.Find(key.as_string());
    if (v) return *v;
    return GetAttr(object, key.as_string());
  }
  if ((object.is_list() || object.is_string()) &&
      (key.kind() == Value::Kind::kInt || key.kind() == Value::Kind::kBool)) {
    int64_t i = key.as_int();
    if (object.is_list()) {
      int64_t n = static_cast<int64_t>(object.list().size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::Undefined("[" + std::to_string(key.as_int()) + "]");
      return object.list()[i];
    }
    std::vector<size_t> offsets = CodePointOffsets(object.as_string());
    int64_t n = static_cast<int64_t>(offsets.size()) - 1;
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::Undefined("[" + std::to_string(key.as_int()) + "]");
    return Value::String(object.as_string().substr(offsets[i], offsets[i + 1] - offsets[i]));
  }
  if (key.is_string()) return GetAttr(object, key.as_string());
  return Value::Undefined(key.ToString());
}

Result<Value> Evaluator::EvalSlice(const Expr& e) {
  PD_ASSIGN_OR_RETURN(Value object, Eval(*e.args[0]));
  if (object.is_undefined()) return UndefinedError(object);
  int64_t bounds[3] = {0, 0, 1};
  bool given[3] = {false, false, false};
  for (int i = 0; i < 3; ++i) {
    if (!e.args[i + 1]) continue;
    PD_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i + 1]));
    if (v.is_none()) continue;
    if (v.kind() != Value::Kind::kInt) return Status::InvalidArgument("slice indices must be ints");
    bounds[i] = v.as_int();
    given[i] = true;
  }
  int64_t step = bounds[2];
  if (step == 0) return Status::InvalidArgument("slice step cannot be zero");
  std::vector<size_t> offsets;
  int64_t n = 0;
  if (object.is_list()) {
    n = static_cast<int64_t>(object.list().size());
  } else if (object.is_string()) {
    offsets = CodePointOffsets(object.as_string());
    n = static_cast<int64_t>(offsets.size()) - 1;
  } else {
    return Status::InvalidArgument("cannot slice '" + std::string(object.TypeName()) + "'");
  }
  // Python's slice.indices().
  auto clamp = [&](int64_t v, bool present, int64_t dflt) {
    if (!present) return dflt;
    if (v < 0) v += n;
    if (step > 0) return std::clamp<int64_t>(v, 0, n);
    return std::clamp<int64_t>(v, -1, n - 1);
  };
  int64_t start = clamp(bounds[0], given[0], step > 0 ? 0 : n - 1);
  int64_t stop = clamp(bounds[1], given[1], step > 0 ? n : -1);
  std::vector<int64_t> picked;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) picked.push_back(i);
  if (object.is_list()) {
    ValueList items;
    items.reserve(picked.size());
    for (int64_t i : picked) items.push_back(object.list()[i]);
    return Value::List(std::move(items));
  }
  std::string s;
  for (int64_t i : picked) s += object.as_string().substr(offsets[i], offsets[i + 1] - offsets[i]);
  return Value::String(std::move(s));
}

Result<CallArgs> Evaluator::EvalArgs(const Expr& e, size_t first_positional) {
  CallArgs args;
  for (size_t i = first_positional; i < e.args.size(); ++i) {
    PD_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i]));
    args.positional.push_back(std::move(v));
  }
  for (const auto& [name, expr] : e.kwargs) {
    PD_ASSIGN_OR_RETURN(Value v, Eval(*expr));
    args.keyword.emplace_back(name, std::move(v));
  }
  return args;
}

Result<Value> Evaluator::Call(const Value& callee, const CallArgs& args) {
  if (callee.kind() != Value::Kind::kCallable) {
    if (callee.is_undefined()) return UndefinedError(callee);
    return Status::InvalidArgument("'" + std::string(callee.TypeName()) +
                                   "' object is not callable");
  }
  const Callable& c = callee.callable();
  switch (c.kind) {
    case Callable::Kind::kMacro:
      return CallMacro(c, args);
    case Callable::Kind::kGlobal:
      return CallGlobal(*this, c.name, args);
    case Callable::Kind::kMethod:
      return CallMethod(*this, *c.self, c.name, args);
  }
  return Value::None();
}

Result<Value> Evaluator::CallMacro(const Callable& macro, const CallArgs& args) {
  const Stmt& def = *macro.macro;
  if (call_depth_ >= limits_.max_call_depth) {
    return Status::InvalidArgument("macro recursion deeper than " +
                                   std::to_string(limits_.max_call_depth));
  }
  PD_RETURN_IF_ERROR(Tick());
  if (args.positional.size() > def.params.size()) {
    return Status::InvalidArgument("macro '" + macro.name + "' takes " +
                                   std::to_string(def.params.size()) + " arguments");
  }
  Frame frame;
  frame.barrier = true;
  frames_.push_back(std::move(frame));
  ++call_depth_;
  Status s;
  for (size_t i = 0; i < def.params.size() && s.ok(); ++i) {
    const auto& [name, default_expr] = def.params[i];
    const Value* given = args.Get(i, name);
    Value v = Value::Undefined(name);
    if (given) {
      v = *given;
    } else if (default_expr) {
      Result<Value> d = Eval(*default_expr);
      if (!d.ok()) {
        s = d.status();
        break;
      }
      v = std::move(d).value();
    }
    frames_.back().Set(name, std::move(v));
  }
  std::string out;
  Flow flow = Flow::kNormal;
  if (s.ok()) s = Exec(def.body, &out, &flow);
  --call_depth_;
  frames_.pop_back();
  PD_RETURN_IF_ERROR(s);
  return Value::String(std::move(out));
}

Result<Value> Evaluator::Eval(const Expr& e) {
  switch (e.kind) {
    case Expr::Kind::kLiteral:
      return e.literal;
    case Expr::Kind::kName:
      return Lookup(e.name);
    case Expr::Kind::kAttr: {
      PD_ASSIGN_OR_RETURN(Value object, Eval(*e.args[0]));
      return GetAttr(object, e.name);
    }
    case Expr::Kind::kItem: {
      PD_ASSIGN_OR_RETURN(Value object, Eval(*e.args[0]));
      PD_ASSIGN_OR_RETURN(Value key, Eval(*e.args[1]));
      return GetItem(object, key);
    }
    case Expr::Kind::kSlice:
      return EvalSlice(e);
    case Expr::Kind::kCall: {
      PD_ASSIGN_OR_RETURN(Value callee, Eval(*e.args[0]));
      PD_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
      return Call(callee, args);
    }
    case Expr::Kind::kFilter: {
      PD_ASSIGN_OR_RETURN(Value value, Eval(*e.args[0]));
      PD_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
      return ApplyFilter(*this, e.name, value, args);
    }
    case Expr::Kind::kTest: {
      PD_ASSIGN_OR_RETURN(Value value, Eval(*e.args[0]));
      PD_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
      PD_ASSIGN_OR_RETURN(bool result, ApplyTest(*this, e.name, value, args));
      return Value::Bool(result != e.negated);
    }
    case Expr::Kind::kNot: {
      PD_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
      return Value::Bool(!v.Truthy());
    }
    case Expr::Kind::kNeg: {
      PD_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
      return Arithmetic("-", Value::Int(0), v);
    }
    case Expr::Kind::kAnd:
    case Expr::Kind::kOr: {
      // Python semantics: the deciding operand itself is the result.
      PD_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
      if (a.Truthy() == (e.kind == Expr::Kind::kOr)) return a;
      return Eval(*e.args[1]);
    }
    case Expr::Kind::kBinary:
      return EvalBinary(e);
    case Expr::Kind::kCond: {
      PD_ASSIGN_OR_RETURN(Value cond, Eval(*e.args[1]));
      if (cond.Truthy()) return Eval(*e.args[0]);
      if (e.args[2]) return Eval(*e.args[2]);
      return Value::Undefined();
    }
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      PD_ASSIGN_OR_RETURN(CallArgs items, EvalArgs(e, 0));
      Value list = Value::List(std::move(items.positional));
      PD_RETURN_IF_ERROR(CheckDepth(list));
      return list;
    }
    case Expr::Kind::kDict: {
      ValueDict dict;
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        PD_ASSIGN_OR_RETURN(Value key, Eval(*e.args[i]));
        if (!key.is_string()) return Status::InvalidArgument("dict keys must be strings");
        PD_ASSIGN_OR_RETURN(Value value, Eval(*e.args[i + 1]));
        bool replaced = false;
        for (auto& [k, v] : dict) {
          if (k == key.as_string()) {
            v = value;
            replaced = true;
          }
        }
        if (!replaced) dict.emplace_back(key.as_string(), std::move(value));
      }
      Value value = Value::Dict(std::move(dict));
      PD_RETURN_IF_ERROR(CheckDepth(value));
      return value;
    }
  }
  return Value::Undefined();
}

Result<Value> Evaluator::EvalBinary(const Expr& e) {
  PD_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
  PD_ASSIGN_OR_RETURN(Value b, Eval(*e.args[1]));
  const std::string& op = e.name;
  if (op == "==") return Value::Bool(a.Equals(b));
  if (op == "!=") return Value::Bool(!a.Equals(b));
  if (op == "<") {
    PD_ASSIGN_OR_RETURN(bool r, Less(a, b));
    return Value::Bool(r);
  }
  if (op == ">") {
    PD_ASSIGN_OR_RETURN(bool r, Less(b, a));
    return Value::Bool(r);
  }
  if (op == "<=") {
    PD_ASSIGN_OR_RETURN(bool r, Less(b, a));
    return Value::Bool(!r);
  }
  if (op == ">=") {
    PD_ASSIGN_OR_RETURN(bool r, Less(a, b));
    return Value::Bool(!r);
  }
  if (op == "in" || op == "notin") {
    PD_ASSIGN_OR_RETURN(bool r, Contains(b, a));
    return Value::Bool(r == (op == "in"));
  }
  if (op == "~") {
    std::string s = a.ToString() + b.ToString();
    PD_RETURN_IF_ERROR(CheckSize(s.size()));
    return Value::String(std::move(s));
  }
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  if (op == "+" && a.is_string() && b.is_string()) {
    PD_RETURN_IF_ERROR(CheckSize(a.as_string().size() + b.as_string().size()));
    return Value::String(a.as_string() + b.as_string());
  }
  if (op == "+" && a.is_list() && b.is_list()) {
    ValueList items = a.list();
    PD_RETURN_IF_ERROR(Tick(static_cast<int64_t>(b.list().size())));
    items.insert(items.end(), b.list().begin(), b.list().end());
    return Value::List(std::move(items));
  }
  if (op == "*" && (a.is_string() || a.is_list()) && b.kind() == Value::Kind::kInt) {
    int64_t times = std::max<int64_t>(b.as_int(), 0);
    if (a.is_string()) {
      PD_RETURN_IF_ERROR(CheckSize(static_cast<double>(a.as_string().size()) * times >
                                           static_cast<double>(limits_.max_output_bytes)
                                       ? limits_.max_output_bytes + 1
                                       : a.as_string().size() * times));
      std::string s;
      for (int64_t i = 0; i < times; ++i) s += a.as_string();
      return Value::String(std::move(s));
    }
    PD_RETURN_IF_ERROR(Tick(static_cast<int64_t>(
        std::min<double>(static_cast<double>(a.list().size()) * times, 1e15))));
    ValueList items;
    for (int64_t i = 0; i < times; ++i) items.insert(items.end(), a.list().begin(), a.list().end());
    return Value::List(std::move(items));
  }
  return Arithmetic(op, a, b);
}

}  // namespace pdserve::jinja
