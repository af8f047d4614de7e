// Evaluator of a parsed chat template: executes the Program against a context of variables.
//
// One Evaluator serves one render and is not shared between threads; the Program it reads is
// immutable and may be shared. Every loop iteration and macro call counts against a step
// budget, macro recursion and output size are bounded, so any template terminates.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "chat/jinja_ast.h"
#include "chat/jinja_value.h"
#include "common/status.h"

namespace pdserve::jinja {

struct RenderLimits {
  size_t max_output_bytes = size_t{8} << 20;  // also bounds every string a template builds
  int64_t max_steps = 1'000'000;              // loop iterations + macro calls + filter items
  int max_call_depth = 64;                    // nested macro calls
  uint32_t max_value_depth = 256;             // nesting of lists and dicts a template builds
};

// Arguments of a call, filter or test (the filtered/tested value itself excluded).
struct CallArgs {
  ValueList positional;
  ValueDict keyword;
  // The argument at `index` or named `name`; nullptr if absent.
  const Value* Get(size_t index, std::string_view name) const;
};

class Evaluator {
 public:
  Evaluator(RenderLimits limits, int64_t now_unix_seconds)
      : limits_(limits), now_unix_seconds_(now_unix_seconds) {}
  Evaluator(const Evaluator&) = delete;
  Evaluator& operator=(const Evaluator&) = delete;
  ~Evaluator();

  Result<std::string> Render(const Program& program, ValueDict context);

  // For the built-in filters, tests and functions.
  Status Tick(int64_t steps = 1);
  Status CheckSize(size_t bytes) const;
  Status CheckDepth(const Value& value) const;
  int64_t now_unix_seconds() const { return now_unix_seconds_; }
  Result<Value> Call(const Value& callee, const CallArgs& args);
  Result<Value> GetAttr(const Value& object, const std::string& name);
  Result<Value> GetItem(const Value& object, const Value& key);

 private:
  enum class Flow : uint8_t { kNormal, kBreak, kContinue };
  // A scope. Few names live in one, so a vector beats a hash map (loops create one per
  // iteration).
  struct Frame {
    std::vector<std::pair<std::string, Value>> vars;
    bool barrier = false;  // a macro's frame: lookups skip to the root frame below it
    const Value* Find(const std::string& name) const;
    void Set(const std::string& name, Value value);
  };

  Status Exec(const StmtList& body, std::string* out, Flow* flow);
  Status ExecStmt(const Stmt& stmt, std::string* out, Flow* flow);
  Status ExecFor(const Stmt& stmt, std::string* out);
  Status ExecSet(const Stmt& stmt, std::string* out);
  Status BindTargets(const Stmt& stmt, const Value& item, Frame* frame);

  Result<Value> Eval(const Expr& e);
  Result<Value> EvalBinary(const Expr& e);
  Result<Value> EvalSlice(const Expr& e);
  Result<CallArgs> EvalArgs(const Expr& e, size_t first_positional);
  Result<Value> CallMacro(const Callable& macro, const CallArgs& args);
  Value Lookup(const std::string& name) const;

  RenderLimits limits_;
  int64_t now_unix_seconds_;
  std::vector<Frame> frames_;
  int64_t steps_ = 0;
  int call_depth_ = 0;
  // Every namespace an attribute was assigned on. Namespaces are the only mutable values, so
  // only such an assignment can close a reference cycle ({% set ns.me = ns %}); the destructor
  // empties them to break those cycles, which reference counting alone would leak.
  std::vector<Value> assigned_namespaces_;
  std::unordered_set<const ValueDict*> assigned_seen_;
};

// Prefixes "line L col C: " for errors raised while evaluating node `at`.
Status ErrorAt(int line, int col, const std::string& what);

}  // namespace pdserve::jinja
