// jinja::Value: the dynamic value of the chat-template interpreter (Python-like semantics:
// undefined, none, bool, int, float, str, list, dict, namespace, callable).
//
// Lists and dicts are shared, immutable after construction (Jinja's sandbox forbids mutating
// them); only a namespace's attributes change, through `set ns.attr = ...`. Values are used by
// one render at a time; a parsed template's literal values are only read, so sharing them
// between threads is safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace pdserve::jinja {

struct Stmt;
class Value;

using ValueList = std::vector<Value>;
// Dicts keep insertion order (Python dicts do); keys are strings. Lookup is linear: chat
// messages have a handful of keys.
using ValueDict = std::vector<std::pair<std::string, Value>>;

// What a callable value calls: a macro, a global function, or a method bound to a receiver.
struct Callable {
  enum class Kind : uint8_t { kMacro, kGlobal, kMethod };
  Kind kind = Kind::kGlobal;
  std::string name;                   // function or method name
  const Stmt* macro = nullptr;        // kMacro: the definition (owned by the Program)
  std::shared_ptr<const Value> self;  // kMethod: the receiver
};

// The arguments of Python's json.dumps that Hugging Face's `tojson` filter exposes:
// tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
struct JsonStyle {
  bool ensure_ascii = false;  // true: non-ASCII as \uXXXX (surrogate pairs above U+FFFF)
  std::string indent;         // with `pretty`: the string repeated per nesting level
  bool pretty = false;        // indent given: one item per line
  // Python's defaults: ", " and ": " on one line, "," and ": " when pretty.
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;  // false: insertion order, as Python dicts
};

class Value {
 public:
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kCallable
  };

  Value() = default;  // undefined
  static Value Undefined(std::string name = "") {
    Value v;
    v.str_ = std::move(name);
    return v;
  }
  static Value None() { return Value(Kind::kNone); }
  static Value Bool(bool b) {
    Value v(Kind::kBool);
    v.int_ = b ? 1 : 0;
    return v;
  }
  static Value Int(int64_t i) {
    Value v(Kind::kInt);
    v.int_ = i;
    return v;
  }
  static Value Float(double f) {
    Value v(Kind::kFloat);
    v.float_ = f;
    return v;
  }
  static Value String(std::string s) {
    Value v(Kind::kString);
    v.str_ = std::move(s);
    return v;
  }
  static Value List(ValueList items);
  static Value Dict(ValueDict items);
  // A namespace() object: a dict whose attributes `set` may change (shared by copies).
  static Value Namespace(ValueDict items);
  static Value Function(Callable callable);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_list() const { return kind_ == Kind::kList; }
  // Dicts and namespaces both map names to values.
  bool is_mapping() const { return kind_ == Kind::kDict || kind_ == Kind::kNamespace; }

  bool as_bool() const { return int_ != 0; }
  int64_t as_int() const { return int_; }
  // Int or float as double.
  double as_double() const { return kind_ == Kind::kInt ? static_cast<double>(int_) : float_; }
  const std::string& as_string() const { return str_; }
  // For undefined values: the name that was looked up (for error messages).
  const std::string& undefined_name() const { return str_; }
  const ValueList& list() const { return *list_; }
  const ValueDict& dict() const { return *dict_; }
  ValueDict& mutable_namespace() const { return *dict_; }
  const Callable& callable() const { return *callable_; }
  // Nesting depth of lists and dicts (0 for scalars and namespaces, whose contents printing and
  // tojson do not recurse into); bounded by the evaluator so recursion stays shallow.
  uint32_t depth() const { return depth_; }

  // Dict/namespace member or nullptr.
  const Value* Find(std::string_view key) const;

  // Python truthiness.
  bool Truthy() const;
  // Python str(): what {{ value }} prints ("" for undefined, "None", "True", "[1, 'a']").
  std::string ToString() const;
  // Python repr() (strings quoted), used inside lists and dicts.
  std::string Repr() const;
  // Python ==.
  bool Equals(const Value& other) const;
  // Python json.dumps(value, **style) (see JsonStyle). Errors for undefined values, callables,
  // namespaces and non-finite floats, as Python raises for them.
  Result<std::string> ToJson(const JsonStyle& style) const;
  // Type name for error messages ("string", "list", ...).
  std::string_view TypeName() const;

  // JSON -> Value, object keys in document order (the caller parses with ordered_json, as
  // Python's json.loads keeps insertion order). Errors past `max_depth` nesting.
  static Result<Value> FromJson(const nlohmann::ordered_json& json, int max_depth);

 private:
  explicit Value(Kind kind) : kind_(kind) {}
  Status AppendJson(std::string* out, const JsonStyle& style, int level) const;

  Kind kind_ = Kind::kUndefined;
  uint32_t depth_ = 0;
  int64_t int_ = 0;
  double float_ = 0;
  std::string str_;
  std::shared_ptr<const ValueList> list_;
  std::shared_ptr<ValueDict> dict_;
  std::shared_ptr<const Callable> callable_;
};

// Python repr of a float ("1.0", "0.1", "1e+20", "inf").
std::string FloatRepr(double d);
// Number of Unicode code points in UTF-8 text (Python len of str).
size_t CodePointCount(std::string_view s);
// Byte offset of every code point start, plus s.size() at the end.
std::vector<size_t> CodePointOffsets(std::string_view s);
// Python's str.isspace() on the code point that starts at byte `at` (or, for PySpaceBefore,
// ends at byte `end`): its UTF-8 length when it is whitespace, else 0. Whitespace is what
// str.strip()/split() remove: ASCII \t\n\v\f\r, 0x1C-0x1F and space, U+0085, U+00A0, U+1680,
// U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000 (not U+200B or U+FEFF).
size_t PySpaceAt(std::string_view s, size_t at);
size_t PySpaceBefore(std::string_view s, size_t end);

}  // namespace pdserve::jinja
