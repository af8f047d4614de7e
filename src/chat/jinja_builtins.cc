#include "chat/jinja_builtins.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <string_view>
#include <utility>
#include <vector>

namespace pdserve::jinja {
namespace {

Status ArgError(const std::string& fn, const std::string& what) {
  return Status::InvalidArgument(fn + ": " + what);
}

Result<std::string> StringArg(const std::string& fn, const CallArgs& args, size_t i,
                              std::string_view name, std::string dflt, bool required = false) {
  const Value* v = args.Get(i, name);
  if (v == nullptr || v->is_none()) {
    if (required) return ArgError(fn, "missing argument '" + std::string(name) + "'");
    return dflt;
  }
  if (!v->is_string()) return ArgError(fn, "argument '" + std::string(name) + "' must be a string");
  return v->as_string();
}

Result<int64_t> IntArg(const std::string& fn, const CallArgs& args, size_t i, std::string_view name,
                       int64_t dflt) {
  const Value* v = args.Get(i, name);
  if (v == nullptr || v->is_none()) return dflt;
  if (v->kind() != Value::Kind::kInt && v->kind() != Value::Kind::kBool) {
    return ArgError(fn, "argument '" + std::string(name) + "' must be an integer");
  }
  return v->as_int();
}

bool BoolArg(const CallArgs& args, size_t i, std::string_view name, bool dflt) {
  const Value* v = args.Get(i, name);
  return v == nullptr ? dflt : v->Truthy();
}

// Code points of s as separate strings (for strip sets and reversal).
std::vector<std::string_view> CodePoints(std::string_view s) {
  std::vector<size_t> offsets = CodePointOffsets(s);
  std::vector<std::string_view> out;
  for (size_t i = 0; i + 1 < offsets.size(); ++i) {
    out.push_back(s.substr(offsets[i], offsets[i + 1] - offsets[i]));
  }
  return out;
}

// Python str.strip/lstrip/rstrip; `chars` null means Unicode whitespace (str.isspace).
std::string Strip(std::string_view s, const std::string* chars, bool left, bool right) {
  size_t b = 0, e = s.size();
  if (chars == nullptr) {
    while (left && b < e) {
      size_t n = PySpaceAt(s, b);
      if (n == 0) break;
      b += n;
    }
    while (right && e > b) {
      size_t n = PySpaceBefore(s, e);
      if (n == 0) break;
      e -= n;
    }
    return std::string(s.substr(b, e - b));
  }
  std::vector<std::string_view> set = CodePoints(*chars);
  auto in_set = [&](std::string_view cp) {
    return std::find(set.begin(), set.end(), cp) != set.end();
  };
  std::vector<std::string_view> cps = CodePoints(s);
  size_t cb = 0, ce = cps.size();
  while (left && cb < ce && in_set(cps[cb])) ++cb;
  while (right && ce > cb && in_set(cps[ce - 1])) --ce;
  std::string out;
  for (size_t i = cb; i < ce; ++i) out += cps[i];
  return out;
}

std::string MapAscii(std::string s, int (*fn)(int)) {
  for (char& c : s) {
    if (static_cast<unsigned char>(c) < 0x80) c = static_cast<char>(fn(c));
  }
  return s;
}

std::string Title(std::string s) {
  bool prev_alpha = false;
  for (char& c : s) {
    bool alpha = std::isalpha(static_cast<unsigned char>(c)) != 0;
    if (alpha) c = static_cast<char>(prev_alpha ? std::tolower(c) : std::toupper(c));
    prev_alpha = alpha;
  }
  return s;
}

std::string Capitalize(std::string s) {
  s = MapAscii(std::move(s), ::tolower);
  if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
  return s;
}

Result<std::vector<std::string>> Split(Evaluator& ev, const std::string& s, const Value* sep,
                                       int64_t maxsplit) {
  std::vector<std::string> parts;
  if (sep == nullptr || sep->is_none()) {
    size_t i = 0;
    while (true) {
      while (size_t n = PySpaceAt(s, i)) i += n;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        // Like Python, the remainder keeps its trailing whitespace.
        parts.push_back(s.substr(i));
        break;
      }
      size_t j = i;
      while (j < s.size() && PySpaceAt(s, j) == 0) ++j;
      parts.push_back(s.substr(i, j - i));
      i = j;
    }
  } else {
    if (!sep->is_string()) return ArgError("split", "separator must be a string");
    const std::string& d = sep->as_string();
    if (d.empty()) return ArgError("split", "empty separator");
    size_t i = 0;
    while (true) {
      size_t j = s.find(d, i);
      if (j == std::string::npos ||
          (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit)) {
        parts.push_back(s.substr(i));
        break;
      }
      parts.push_back(s.substr(i, j - i));
      i = j + d.size();
    }
  }
  PD_RETURN_IF_ERROR(ev.Tick(static_cast<int64_t>(parts.size())));
  return parts;
}

Value StringList(std::vector<std::string> parts) {
  ValueList items;
  items.reserve(parts.size());
  for (std::string& p : parts) items.push_back(Value::String(std::move(p)));
  return Value::List(std::move(items));
}

// The items a filter iterates: list items, dict keys, string characters.
Result<ValueList> Items(const std::string& fn, const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kList:
      return v.list();
    case Value::Kind::kDict:
    case Value::Kind::kNamespace: {
      ValueList keys;
      for (const auto& [k, unused] : v.dict()) keys.push_back(Value::String(k));
      return keys;
    }
    case Value::Kind::kString: {
      ValueList chars;
      for (std::string_view cp : CodePoints(v.as_string()))
        chars.push_back(Value::String(std::string(cp)));
      return chars;
    }
    case Value::Kind::kUndefined:
      return ValueList{};
    default:
      return ArgError(fn, "'" + std::string(v.TypeName()) + "' is not iterable");
  }
}

// item.a.b for the attribute="a.b" arguments of map/selectattr/sort/join.
Result<Value> AttributePath(Evaluator& ev, const Value& item, const std::string& path) {
  Value v = item;
  size_t start = 0;
  while (start <= path.size()) {
    size_t dot = path.find('.', start);
    std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (v.is_undefined()) return v;
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    if (numeric) {
      PD_ASSIGN_OR_RETURN(v, ev.GetItem(v, Value::Int(std::stoll(part))));
    } else {
      PD_ASSIGN_OR_RETURN(v, ev.GetItem(v, Value::String(part)));
    }
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return v;
}

CallArgs Rest(const CallArgs& args, size_t from) {
  CallArgs rest;
  for (size_t i = from; i < args.positional.size(); ++i)
    rest.positional.push_back(args.positional[i]);
  rest.keyword = args.keyword;
  return rest;
}

Result<Value> FilterSelect(Evaluator& ev, const std::string& name, const Value& value,
                           const CallArgs& args) {
  bool by_attr = name == "selectattr" || name == "rejectattr";
  bool keep_if = name == "select" || name == "selectattr";
  PD_ASSIGN_OR_RETURN(ValueList items, Items(name, value));
  PD_RETURN_IF_ERROR(ev.Tick(static_cast<int64_t>(items.size())));
  size_t next = 0;
  std::string attr;
  if (by_attr) {
    PD_ASSIGN_OR_RETURN(attr, StringArg(name, args, next++, "attribute", "", true));
  }
  std::string test;
  if (next < args.positional.size()) {
    PD_ASSIGN_OR_RETURN(test, StringArg(name, args, next++, "", ""));
  }
  CallArgs test_args;
  for (size_t i = next; i < args.positional.size(); ++i)
    test_args.positional.push_back(args.positional[i]);
  ValueList out;
  for (const Value& item : items) {
    Value subject = item;
    if (by_attr) {
      PD_ASSIGN_OR_RETURN(subject, AttributePath(ev, item, attr));
    }
    bool pass = subject.Truthy();
    if (!test.empty()) {
      PD_ASSIGN_OR_RETURN(pass, ApplyTest(ev, test, subject, test_args));
    }
    if (pass == keep_if) out.push_back(item);
  }
  return Value::List(std::move(out));
}

Result<Value> FilterMap(Evaluator& ev, const Value& value, const CallArgs& args) {
  PD_ASSIGN_OR_RETURN(ValueList items, Items("map", value));
  PD_RETURN_IF_ERROR(ev.Tick(static_cast<int64_t>(items.size())));
  ValueList out;
  if (const Value* attr = args.Get(SIZE_MAX, "attribute")) {
    if (!attr->is_string()) return ArgError("map", "attribute must be a string");
    const Value* dflt = args.Get(SIZE_MAX, "default");
    for (const Value& item : items) {
      PD_ASSIGN_OR_RETURN(Value v, AttributePath(ev, item, attr->as_string()));
      out.push_back(v.is_undefined() && dflt ? *dflt : v);
    }
    return Value::List(std::move(out));
  }
  PD_ASSIGN_OR_RETURN(std::string filter, StringArg("map", args, 0, "", "", true));
  CallArgs rest = Rest(args, 1);
  for (const Value& item : items) {
    PD_ASSIGN_OR_RETURN(Value v, ApplyFilter(ev, filter, item, rest));
    out.push_back(std::move(v));
  }
  return Value::List(std::move(out));
}

Result<Value> FilterJoin(Evaluator& ev, const Value& value, const CallArgs& args) {
  PD_ASSIGN_OR_RETURN(std::string sep, StringArg("join", args, 0, "d", ""));
  PD_ASSIGN_OR_RETURN(ValueList items, Items("join", value));
  const Value* attr = args.Get(1, "attribute");
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    Value item = items[i];
    if (attr && attr->is_string()) {
      PD_ASSIGN_OR_RETURN(item, AttributePath(ev, item, attr->as_string()));
    }
    out += item.ToString();
    PD_RETURN_IF_ERROR(ev.CheckSize(out.size()));
  }
  return Value::String(std::move(out));
}

Result<Value> FilterSort(Evaluator& ev, const Value& value, const CallArgs& args) {
  PD_ASSIGN_OR_RETURN(ValueList items, Items("sort", value));
  bool reverse = BoolArg(args, 0, "reverse", false);
  const Value* attr = args.Get(2, "attribute");
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& item : items) {
    Value key = item;
    if (attr && attr->is_string()) {
      PD_ASSIGN_OR_RETURN(key, AttributePath(ev, item, attr->as_string()));
    }
    if (key.is_string() && !BoolArg(args, 1, "case_sensitive", false)) {
      key = Value::String(MapAscii(key.as_string(), ::tolower));
    }
    keyed.emplace_back(std::move(key), item);
  }
  Status error;
  auto less = [&](const std::pair<Value, Value>& a, const std::pair<Value, Value>& b) {
    const Value &x = a.first, &y = b.first;
    if (x.is_number() && y.is_number()) return x.as_double() < y.as_double();
    if (x.is_string() && y.is_string()) return x.as_string() < y.as_string();
    error = ArgError("sort", "cannot compare " + std::string(x.TypeName()) + " and " +
                                 std::string(y.TypeName()));
    return false;
  };
  std::stable_sort(keyed.begin(), keyed.end(), less);
  PD_RETURN_IF_ERROR(error);
  if (reverse) std::reverse(keyed.begin(), keyed.end());
  ValueList out;
  for (auto& [k, v] : keyed) out.push_back(std::move(v));
  return Value::List(std::move(out));
}

Result<Value> FilterIndent(const Value& value, const CallArgs& args) {
  std::string pad(4, ' ');
  if (const Value* w = args.Get(0, "width")) {
    if (w->is_string()) {
      pad = w->as_string();
    } else if (w->kind() == Value::Kind::kInt) {
      pad = std::string(static_cast<size_t>(std::clamp<int64_t>(w->as_int(), 0, 256)), ' ');
    }
  }
  bool first = BoolArg(args, 1, "first", false), blank = BoolArg(args, 2, "blank", false);
  std::string s = value.ToString(), out;
  size_t start = 0;
  bool is_first = true;
  while (start <= s.size()) {
    size_t nl = s.find('\n', start);
    std::string line = s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
    if ((is_first ? first : true) && (blank || !line.empty())) out += pad;
    out += line;
    if (nl == std::string::npos) break;
    out += '\n';
    start = nl + 1;
    is_first = false;
  }
  return Value::String(std::move(out));
}

std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

Result<Value> Length(const std::string& fn, const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kString:
      return Value::Int(static_cast<int64_t>(CodePointCount(value.as_string())));
    case Value::Kind::kList:
      return Value::Int(static_cast<int64_t>(value.list().size()));
    case Value::Kind::kDict:
    case Value::Kind::kNamespace:
      return Value::Int(static_cast<int64_t>(value.dict().size()));
    case Value::Kind::kUndefined:
      return Value::Int(0);
    default:
      return ArgError(fn, "object of type '" + std::string(value.TypeName()) + "' has no len()");
  }
}

Result<Value> ToNumber(const std::string& fn, const Value& value, const CallArgs& args) {
  bool to_int = fn == "int";
  const Value* dflt = args.Get(0, "default");
  Value fallback = dflt ? *dflt : (to_int ? Value::Int(0) : Value::Float(0));
  if (value.is_number() || value.kind() == Value::Kind::kBool) {
    if (to_int)
      return Value::Int(value.kind() == Value::Kind::kFloat ? int64_t(value.as_double())
                                                            : value.as_int());
    return Value::Float(value.as_double());
  }
  if (!value.is_string()) return fallback;
  std::string s = Strip(value.as_string(), nullptr, true, true);
  char* end = nullptr;
  if (to_int) {
    long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0') return fallback;
    return Value::Int(v);
  }
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0') return fallback;
  return Value::Float(v);
}

// Hugging Face's tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False) -- no HTML escaping, unlike Jinja's own tojson.
Result<Value> FilterTojson(const Value& value, const CallArgs& args) {
  JsonStyle style;
  if (const Value* v = args.Get(1, "indent"); v && !v->is_none()) {
    // Python: an int indents by that many spaces (<= 0: newlines only), a string is used as is.
    if (v->is_string()) {
      style.indent = v->as_string();
    } else if (v->kind() == Value::Kind::kInt) {
      style.indent.assign(static_cast<size_t>(std::clamp<int64_t>(v->as_int(), 0, 64)), ' ');
    } else {
      return ArgError("tojson", "indent must be an integer or a string");
    }
    style.pretty = true;
    style.item_separator = ",";
  }
  style.ensure_ascii = BoolArg(args, 0, "ensure_ascii", false);
  if (const Value* v = args.Get(2, "separators"); v && !v->is_none()) {
    if (!v->is_list() || v->list().size() != 2 || !v->list()[0].is_string() ||
        !v->list()[1].is_string()) {
      return ArgError("tojson", "separators must be a pair of strings");
    }
    style.item_separator = v->list()[0].as_string();
    style.key_separator = v->list()[1].as_string();
  }
  style.sort_keys = BoolArg(args, 3, "sort_keys", false);
  PD_ASSIGN_OR_RETURN(std::string json, value.ToJson(style));
  return Value::String(std::move(json));
}

}  // namespace

Result<Value> ApplyFilter(Evaluator& ev, const std::string& name, const Value& value,
                          const CallArgs& args) {
  if (name == "length" || name == "count") return Length(name, value);
  if (name == "string") return Value::String(value.ToString());
  if (name == "trim") {
    // trim(chars=None) is Python's str.strip(chars): none strips whitespace, '' strips nothing.
    const Value* chars = args.Get(0, "chars");
    if (chars != nullptr && !chars->is_none() && !chars->is_string()) {
      return ArgError(name, "argument 'chars' must be a string");
    }
    const std::string* set = chars != nullptr && chars->is_string() ? &chars->as_string() : nullptr;
    return Value::String(Strip(value.ToString(), set, true, true));
  }
  if (name == "tojson") return FilterTojson(value, args);
  if (name == "safe" || name == "list" || name == "items" || name == "dictsort") {
    if (name == "safe") return value;
    if (name == "list") {
      PD_ASSIGN_OR_RETURN(ValueList items, Items(name, value));
      return Value::List(std::move(items));
    }
    if (value.is_undefined()) return Value::List({});
    if (!value.is_mapping()) return ArgError(name, "expected a mapping");
    ValueList pairs;
    for (const auto& [k, v] : value.dict()) pairs.push_back(Value::List({Value::String(k), v}));
    if (name == "dictsort") {
      std::stable_sort(pairs.begin(), pairs.end(), [](const Value& a, const Value& b) {
        return a.list()[0].as_string() < b.list()[0].as_string();
      });
    }
    return Value::List(std::move(pairs));
  }
  if (name == "lower") return Value::String(MapAscii(value.ToString(), ::tolower));
  if (name == "upper") return Value::String(MapAscii(value.ToString(), ::toupper));
  if (name == "title") return Value::String(Title(value.ToString()));
  if (name == "capitalize") return Value::String(Capitalize(value.ToString()));
  if (name == "e" || name == "escape") return Value::String(HtmlEscape(value.ToString()));
  if (name == "default" || name == "d") {
    bool use_default = BoolArg(args, 1, "boolean", false) ? !value.Truthy() : value.is_undefined();
    if (!use_default) return value;
    const Value* dflt = args.Get(0, "default_value");
    return dflt ? *dflt : Value::String("");
  }
  if (name == "first" || name == "last") {
    PD_ASSIGN_OR_RETURN(ValueList items, Items(name, value));
    if (items.empty()) return Value::Undefined(name);
    return name == "first" ? items.front() : items.back();
  }
  if (name == "reverse") {
    PD_ASSIGN_OR_RETURN(ValueList items, Items(name, value));
    std::reverse(items.begin(), items.end());
    if (!value.is_string()) return Value::List(std::move(items));
    std::string s;
    for (const Value& c : items) s += c.as_string();
    return Value::String(std::move(s));
  }
  if (name == "unique") {
    PD_ASSIGN_OR_RETURN(ValueList items, Items(name, value));
    PD_RETURN_IF_ERROR(ev.Tick(static_cast<int64_t>(items.size())));
    ValueList out;
    for (const Value& item : items) {
      if (std::none_of(out.begin(), out.end(), [&](const Value& o) { return o.Equals(item); })) {
        out.push_back(item);
      }
    }
    return Value::List(std::move(out));
  }
  if (name == "join") return FilterJoin(ev, value, args);
  if (name == "map") return FilterMap(ev, value, args);
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    return FilterSelect(ev, name, value, args);
  }
  if (name == "sort") return FilterSort(ev, value, args);
  if (name == "replace") {
    if (!value.is_string()) return ArgError(name, "expected a string");
    PD_ASSIGN_OR_RETURN(std::string from, StringArg(name, args, 0, "old", "", true));
    PD_ASSIGN_OR_RETURN(std::string to, StringArg(name, args, 1, "new", "", true));
    PD_ASSIGN_OR_RETURN(int64_t count, IntArg(name, args, 2, "count", -1));
    CallArgs method_args;
    method_args.positional = {Value::String(from), Value::String(to), Value::Int(count)};
    return CallMethod(ev, value, "replace", method_args);
  }
  if (name == "indent") return FilterIndent(value, args);
  if (name == "int" || name == "float") return ToNumber(name, value, args);
  if (name == "abs") {
    if (value.kind() == Value::Kind::kInt) {
      if (value.as_int() == INT64_MIN) return Value::Float(-static_cast<double>(INT64_MIN));
      return Value::Int(value.as_int() < 0 ? -value.as_int() : value.as_int());
    }
    if (value.kind() == Value::Kind::kFloat) return Value::Float(std::fabs(value.as_double()));
    return ArgError(name, "expected a number");
  }
  if (name == "round") {
    if (!value.is_number()) return ArgError(name, "expected a number");
    PD_ASSIGN_OR_RETURN(int64_t precision, IntArg(name, args, 0, "precision", 0));
    double scale = std::pow(10.0, static_cast<double>(std::clamp<int64_t>(precision, -15, 15)));
    return Value::Float(std::round(value.as_double() * scale) / scale);
  }
  return Status::InvalidArgument("no filter named '" + name + "'");
}

Result<bool> ApplyTest(Evaluator& ev, const std::string& name, const Value& value,
                       const CallArgs& args) {
  using K = Value::Kind;
  const K k = value.kind();
  if (name == "defined") return k != K::kUndefined;
  if (name == "undefined") return k == K::kUndefined;
  if (name == "none") return k == K::kNone;
  if (name == "boolean") return k == K::kBool;
  if (name == "true") return k == K::kBool && value.as_bool();
  if (name == "false") return k == K::kBool && !value.as_bool();
  if (name == "integer") return k == K::kInt;
  if (name == "float") return k == K::kFloat;
  if (name == "number") return k == K::kInt || k == K::kFloat || k == K::kBool;
  if (name == "string") return k == K::kString;
  if (name == "mapping") return k == K::kDict || k == K::kNamespace;
  // Strings are iterable and sequences in Python; undefined iterates as empty.
  if (name == "iterable")
    return k == K::kString || k == K::kList || k == K::kDict || k == K::kUndefined;
  if (name == "sequence") return k == K::kString || k == K::kList || k == K::kDict;
  if (name == "callable") return k == K::kCallable;
  if (name == "lower" || name == "upper") {
    if (k != K::kString) return false;
    const std::string& s = value.as_string();
    return MapAscii(s, name == "lower" ? ::tolower : ::toupper) == s;
  }
  if (name == "even" || name == "odd" || name == "divisibleby") {
    if (k != K::kInt) return ArgError(name, "expected an integer");
    int64_t d = 2;
    if (name == "divisibleby") {
      PD_ASSIGN_OR_RETURN(d, IntArg(name, args, 0, "num", 0));
    }
    if (d == 0) return ArgError(name, "division by zero");
    bool divisible = value.as_int() % d == 0;
    return name == "odd" ? !divisible : divisible;
  }
  const Value* other = args.Get(0, "other");
  if (name == "eq" || name == "equalto" || name == "==" || name == "ne" || name == "!=" ||
      name == "sameas" || name == "in" || name == "lt" || name == "le" || name == "gt" ||
      name == "ge") {
    if (other == nullptr) return ArgError(name, "missing argument");
    if (name == "eq" || name == "equalto" || name == "==") return value.Equals(*other);
    if (name == "ne" || name == "!=") return !value.Equals(*other);
    if (name == "sameas") {
      if (k != other->kind()) return false;
      return (k == K::kNone || k == K::kUndefined || k == K::kBool) ? value.Equals(*other)
                                                                    : value.Equals(*other);
    }
    if (name == "in") {
      CallArgs unused;
      (void)unused;
      if (other->is_string()) {
        return value.is_string() && other->as_string().find(value.as_string()) != std::string::npos;
      }
      PD_ASSIGN_OR_RETURN(ValueList items, Items(name, *other));
      return std::any_of(items.begin(), items.end(),
                         [&](const Value& v) { return v.Equals(value); });
    }
    bool numbers = value.is_number() && other->is_number();
    bool strings = value.is_string() && other->is_string();
    if (!numbers && !strings) return ArgError(name, "cannot compare these types");
    int cmp = numbers ? (value.as_double() < other->as_double()   ? -1
                         : value.as_double() > other->as_double() ? 1
                                                                  : 0)
                      : value.as_string().compare(other->as_string());
    if (name == "lt") return cmp < 0;
    if (name == "le") return cmp <= 0;
    if (name == "gt") return cmp > 0;
    return cmp >= 0;
  }
  (void)ev;
  return Status::InvalidArgument("no test named '" + name + "'");
}

bool IsGlobalFunction(const std::string& name) {
  return name == "raise_exception" || name == "strftime_now" || name == "namespace" ||
         name == "range" || name == "dict";
}

Result<Value> CallGlobal(Evaluator& ev, const std::string& name, const CallArgs& args) {
  if (name == "raise_exception") {
    const Value* msg = args.Get(0, "message");
    // kCancelled marks the template's own error; the evaluator reports it as InvalidArgument.
    return Status::Cancelled(msg ? msg->ToString() : "raise_exception called");
  }
  if (name == "strftime_now") {
    PD_ASSIGN_OR_RETURN(std::string format, StringArg(name, args, 0, "format", "", true));
    if (format.size() > 256) return ArgError(name, "format too long");
    std::time_t t = static_cast<std::time_t>(ev.now_unix_seconds());
    std::tm tm{};
    gmtime_r(&t, &tm);
    char buf[1024];
    size_t n = format.empty() ? 0 : std::strftime(buf, sizeof(buf), format.c_str(), &tm);
    return Value::String(std::string(buf, n));
  }
  if (name == "namespace" || name == "dict") {
    ValueDict attrs;
    for (const Value& p : args.positional) {
      if (!p.is_mapping()) return ArgError(name, "positional argument must be a mapping");
      for (const auto& kv : p.dict()) attrs.push_back(kv);
    }
    for (const auto& kv : args.keyword) attrs.push_back(kv);
    return name == "dict" ? Value::Dict(std::move(attrs)) : Value::Namespace(std::move(attrs));
  }
  if (name == "range") {
    int64_t start = 0, stop = 0, step = 1;
    for (const Value& v : args.positional) {
      if (v.kind() != Value::Kind::kInt) return ArgError(name, "arguments must be integers");
    }
    const ValueList& p = args.positional;
    if (p.size() == 1) {
      stop = p[0].as_int();
    } else if (p.size() == 2 || p.size() == 3) {
      start = p[0].as_int();
      stop = p[1].as_int();
      if (p.size() == 3) step = p[2].as_int();
    } else {
      return ArgError(name, "expected 1 to 3 arguments");
    }
    if (step == 0) return ArgError(name, "step must not be zero");
    double count = std::ceil((static_cast<double>(stop) - static_cast<double>(start)) / step);
    if (count > 0) PD_RETURN_IF_ERROR(ev.Tick(static_cast<int64_t>(std::min(count, 1e15))));
    ValueList items;
    for (__int128 i = start; step > 0 ? i < stop : i > stop; i += step) {
      items.push_back(Value::Int(static_cast<int64_t>(i)));
    }
    return Value::List(std::move(items));
  }
  return Status::InvalidArgument("no function named '" + name + "'");
}

bool HasMethod(const Value& self, const std::string& name) {
  static const std::string_view kStringMethods[] = {
      "startswith", "endswith", "strip",      "lstrip",  "rstrip", "split", "upper",
      "lower",      "title",    "capitalize", "replace", "find",   "join",  "count"};
  static const std::string_view kDictMethods[] = {"get", "items", "keys", "values"};
  if (self.is_string()) {
    return std::find(std::begin(kStringMethods), std::end(kStringMethods), name) !=
           std::end(kStringMethods);
  }
  if (self.kind() == Value::Kind::kDict) {
    return std::find(std::begin(kDictMethods), std::end(kDictMethods), name) !=
           std::end(kDictMethods);
  }
  return false;
}

namespace {

Result<Value> StringMethod(Evaluator& ev, const std::string& s, const std::string& name,
                           const CallArgs& args) {
  if (name == "startswith" || name == "endswith") {
    const Value* arg = args.Get(0, "prefix");
    if (arg == nullptr) return ArgError(name, "missing argument");
    ValueList candidates = arg->is_list() ? arg->list() : ValueList{*arg};
    for (const Value& c : candidates) {
      if (!c.is_string()) return ArgError(name, "argument must be a string");
      const std::string& x = c.as_string();
      bool match = x.size() <= s.size() &&
                   (name == "startswith" ? s.compare(0, x.size(), x) == 0
                                         : s.compare(s.size() - x.size(), x.size(), x) == 0);
      if (match) return Value::Bool(true);
    }
    return Value::Bool(false);
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const Value* chars = args.Get(0, "chars");
    const std::string* set = (chars && chars->is_string()) ? &chars->as_string() : nullptr;
    return Value::String(Strip(s, set, name != "rstrip", name != "lstrip"));
  }
  if (name == "split") {
    PD_ASSIGN_OR_RETURN(int64_t maxsplit, IntArg(name, args, 1, "maxsplit", -1));
    PD_ASSIGN_OR_RETURN(std::vector<std::string> parts, Split(ev, s, args.Get(0, "sep"), maxsplit));
    return StringList(std::move(parts));
  }
  if (name == "upper") return Value::String(MapAscii(s, ::toupper));
  if (name == "lower") return Value::String(MapAscii(s, ::tolower));
  if (name == "title") return Value::String(Title(s));
  if (name == "capitalize") return Value::String(Capitalize(s));
  if (name == "replace") {
    PD_ASSIGN_OR_RETURN(std::string from, StringArg(name, args, 0, "old", "", true));
    PD_ASSIGN_OR_RETURN(std::string to, StringArg(name, args, 1, "new", "", true));
    PD_ASSIGN_OR_RETURN(int64_t count, IntArg(name, args, 2, "count", -1));
    if (from.empty()) return ArgError(name, "empty search string is not supported");
    std::string out;
    size_t i = 0;
    for (int64_t done = 0; count < 0 || done < count; ++done) {
      size_t j = s.find(from, i);
      if (j == std::string::npos) break;
      out.append(s, i, j - i);
      out += to;
      i = j + from.size();
      PD_RETURN_IF_ERROR(ev.CheckSize(out.size()));
    }
    out.append(s, i, std::string::npos);
    return Value::String(std::move(out));
  }
  if (name == "find" || name == "count") {
    PD_ASSIGN_OR_RETURN(std::string sub, StringArg(name, args, 0, "sub", "", true));
    if (name == "find") {
      size_t at = s.find(sub);
      return Value::Int(at == std::string::npos ? -1
                                                : static_cast<int64_t>(CodePointCount(
                                                      std::string_view(s).substr(0, at))));
    }
    if (sub.empty()) return Value::Int(static_cast<int64_t>(CodePointCount(s)) + 1);
    int64_t n = 0;
    for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
    return Value::Int(n);
  }
  if (name == "join") {
    const Value* items = args.Get(0, "iterable");
    if (items == nullptr) return ArgError(name, "missing argument");
    PD_ASSIGN_OR_RETURN(ValueList list, Items(name, *items));
    std::string out;
    for (size_t i = 0; i < list.size(); ++i) {
      if (!list[i].is_string()) return ArgError(name, "items must be strings");
      if (i) out += s;
      out += list[i].as_string();
      PD_RETURN_IF_ERROR(ev.CheckSize(out.size()));
    }
    return Value::String(std::move(out));
  }
  return ArgError(name, "no such string method");
}

}  // namespace

Result<Value> CallMethod(Evaluator& ev, const Value& self, const std::string& name,
                         const CallArgs& args) {
  if (self.is_string()) return StringMethod(ev, self.as_string(), name, args);
  if (self.kind() == Value::Kind::kDict) {
    if (name == "get") {
      const Value* key = args.Get(0, "key");
      if (key == nullptr) return ArgError(name, "missing key");
      const Value* found = key->is_string() ? self.Find(key->as_string()) : nullptr;
      if (found) return *found;
      const Value* dflt = args.Get(1, "default");
      return dflt ? *dflt : Value::None();
    }
    ValueList out;
    for (const auto& [k, v] : self.dict()) {
      if (name == "items") {
        out.push_back(Value::List({Value::String(k), v}));
      } else if (name == "keys") {
        out.push_back(Value::String(k));
      } else {
        out.push_back(v);
      }
    }
    return Value::List(std::move(out));
  }
  return Status::InvalidArgument("'" + std::string(self.TypeName()) + "' has no method '" + name +
                                 "'");
}

}  // namespace pdserve::jinja
