#include "chat/jinja_value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

namespace pdserve::jinja {

Value Value::List(ValueList items) {
  Value v(Kind::kList);
  for (const Value& item : items) v.depth_ = std::max(v.depth_, item.depth_ + 1);
  v.list_ = std::make_shared<const ValueList>(std::move(items));
  return v;
}

Value Value::Dict(ValueDict items) {
  Value v(Kind::kDict);
  for (const auto& [key, item] : items) v.depth_ = std::max(v.depth_, item.depth_ + 1);
  v.dict_ = std::make_shared<ValueDict>(std::move(items));
  return v;
}

Value Value::Namespace(ValueDict items) {
  Value v(Kind::kNamespace);
  v.dict_ = std::make_shared<ValueDict>(std::move(items));
  return v;
}

Value Value::Function(Callable callable) {
  Value v(Kind::kCallable);
  v.callable_ = std::make_shared<const Callable>(std::move(callable));
  return v;
}

const Value* Value::Find(std::string_view key) const {
  if (!is_mapping()) return nullptr;
  for (const auto& [k, v] : *dict_) {
    if (k == key) return &v;
  }
  return nullptr;
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
    case Kind::kInt:
      return int_ != 0;
    case Kind::kFloat:
      return float_ != 0.0;
    case Kind::kString:
      return !str_.empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return !dict_->empty();
    case Kind::kNamespace:
    case Kind::kCallable:
      return true;
  }
  return false;
}

std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // Shortest representation that reads back exactly, as Python's repr.
  char buf[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  std::string s = buf;
  size_t e = s.find('e');
  if (e != std::string::npos) {
    // C prints 1e+20 as "1e+20"; Python too, but pads the exponent to 2 digits ("1e-05").
    std::string mantissa = s.substr(0, e), exponent = s.substr(e + 1);
    char sign = exponent[0];
    std::string digits = exponent.substr(1);
    while (digits.size() > 2 && digits[0] == '0') digits.erase(0, 1);
    return mantissa + "e" + sign + digits;
  }
  if (s.find('.') == std::string::npos && s.find("inf") == std::string::npos) s += ".0";
  return s;
}

std::string Value::ToString() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return str_;
    default:
      return Repr();
  }
}

namespace {

std::string PyQuote(const std::string& s) {
  char quote = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, quote);
  for (char c : s) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c == quote) out += '\\';
        out += c;
    }
  }
  out += quote;
  return out;
}

// `unit` is one UTF-16 code unit (callers split larger code points into surrogates).
void AppendUnicodeEscape(std::string* out, uint32_t unit) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(unit & 0xffffu));
  *out += buf;
}

// The code point of the UTF-8 sequence at s[*i], advancing *i; invalid bytes read as U+FFFD
// (requests are validated UTF-8, so this only guards against template-made strings).
uint32_t DecodeUtf8(const std::string& s, size_t* i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(*i);
  const int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
  if (len == 1 || *i + len > s.size()) {
    ++*i;
    return c < 0x80 ? c : 0xFFFD;
  }
  uint32_t cp = c & (0x3F >> (len - 1));
  for (int k = 1; k < len; ++k) {
    if ((byte(*i + k) & 0xC0) != 0x80) {
      ++*i;
      return 0xFFFD;
    }
    cp = (cp << 6) | (byte(*i + k) & 0x3F);
  }
  *i += len;
  return cp;
}

// A JSON string as Python's json.dumps writes it: \" \\ \n \r \t \b \f, other control
// characters as \u00XX, and (ensure_ascii) everything past ASCII as \uXXXX.
void AppendJsonString(std::string* out, const std::string& s, bool ensure_ascii) {
  *out += '"';
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      if (!ensure_ascii) {
        *out += static_cast<char>(c);
        ++i;
        continue;
      }
      uint32_t cp = DecodeUtf8(s, &i);
      if (cp >= 0x10000) {
        cp -= 0x10000;
        AppendUnicodeEscape(out, 0xD800 + (cp >> 10));
        AppendUnicodeEscape(out, 0xDC00 + (cp & 0x3FF));
      } else {
        AppendUnicodeEscape(out, cp);
      }
      continue;
    }
    ++i;
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (c < 0x20 || (c == 0x7F && ensure_ascii)) {
          AppendUnicodeEscape(out, c);
        } else {
          *out += static_cast<char>(c);
        }
    }
  }
  *out += '"';
}

}  // namespace

std::string Value::Repr() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return int_ ? "True" : "False";
    case Kind::kInt:
      return std::to_string(int_);
    case Kind::kFloat:
      return FloatRepr(float_);
    case Kind::kString:
      return PyQuote(str_);
    case Kind::kList: {
      std::string out = "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i) out += ", ";
        out += (*list_)[i].Repr();
      }
      return out + "]";
    }
    case Kind::kDict: {
      std::string out = "{";
      for (size_t i = 0; i < dict_->size(); ++i) {
        if (i) out += ", ";
        out += PyQuote((*dict_)[i].first) + ": " + (*dict_)[i].second.Repr();
      }
      return out + "}";
    }
    case Kind::kNamespace:
      return "<Namespace>";
    case Kind::kCallable:
      return "<function " + callable_->name + ">";
  }
  return "";
}

bool Value::Equals(const Value& other) const {
  if (is_number() || kind_ == Kind::kBool) {
    if (!(other.is_number() || other.kind_ == Kind::kBool)) return false;
    if (kind_ == Kind::kFloat || other.kind_ == Kind::kFloat) {
      return as_double() == other.as_double();
    }
    return int_ == other.int_;
  }
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return str_ == other.str_;
    case Kind::kList: {
      if (list_->size() != other.list_->size()) return false;
      for (size_t i = 0; i < list_->size(); ++i) {
        if (!(*list_)[i].Equals((*other.list_)[i])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      if (dict_->size() != other.dict_->size()) return false;
      for (const auto& [k, v] : *dict_) {
        const Value* o = other.Find(k);
        if (o == nullptr || !v.Equals(*o)) return false;
      }
      return true;
    }
    case Kind::kNamespace:
      return dict_ == other.dict_;
    case Kind::kCallable:
      return callable_ == other.callable_;
    default:
      return false;
  }
}

std::string_view Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNone:
      return "none";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "string";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "namespace";
    case Kind::kCallable:
      return "function";
  }
  return "?";
}

Status Value::AppendJson(std::string* out, const JsonStyle& style, int level) const {
  auto newline = [&](int lvl) {
    if (style.pretty) {
      *out += '\n';
      for (int i = 0; i < lvl; ++i) *out += style.indent;
    }
  };
  switch (kind_) {
    case Kind::kNone:
      *out += "null";
      return Status::Ok();
    case Kind::kBool:
      *out += int_ ? "true" : "false";
      return Status::Ok();
    case Kind::kInt:
      *out += std::to_string(int_);
      return Status::Ok();
    case Kind::kFloat:
      if (!std::isfinite(float_)) return Status::InvalidArgument("tojson: non-finite float");
      *out += FloatRepr(float_);
      return Status::Ok();
    case Kind::kString:
      AppendJsonString(out, str_, style.ensure_ascii);
      return Status::Ok();
    case Kind::kList:
      if (list_->empty()) {
        *out += "[]";
        return Status::Ok();
      }
      *out += '[';
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i) *out += style.item_separator;
        newline(level + 1);
        PD_RETURN_IF_ERROR((*list_)[i].AppendJson(out, style, level + 1));
      }
      newline(level);
      *out += ']';
      return Status::Ok();
    case Kind::kNamespace:
      // Like Python: a namespace is not JSON serializable (and may contain itself).
      return Status::InvalidArgument("tojson: a namespace is not JSON serializable");
    case Kind::kDict: {
      if (dict_->empty()) {
        *out += "{}";
        return Status::Ok();
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& item : *dict_) items.push_back(&item);
      if (style.sort_keys) {
        // Byte order of UTF-8 is code point order, which is how Python sorts str keys.
        std::stable_sort(items.begin(), items.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      }
      *out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) *out += style.item_separator;
        newline(level + 1);
        AppendJsonString(out, items[i]->first, style.ensure_ascii);
        *out += style.key_separator;
        PD_RETURN_IF_ERROR(items[i]->second.AppendJson(out, style, level + 1));
      }
      newline(level);
      *out += '}';
      return Status::Ok();
    }
    case Kind::kUndefined:
      return Status::InvalidArgument("tojson: value is undefined");
    case Kind::kCallable:
      return Status::InvalidArgument("tojson: a function is not JSON serializable");
  }
  return Status::Ok();
}

Result<std::string> Value::ToJson(const JsonStyle& style) const {
  std::string out;
  PD_RETURN_IF_ERROR(AppendJson(&out, style, 0));
  return out;
}

Result<Value> Value::FromJson(const nlohmann::ordered_json& json, int max_depth) {
  if (max_depth <= 0) return Status::InvalidArgument("JSON nested too deeply");
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
    case nlohmann::ordered_json::value_t::discarded:
      return None();
    case nlohmann::ordered_json::value_t::boolean:
      return Bool(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Int(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = json.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Float(static_cast<double>(u));
      return Int(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Float(json.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return String(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      items.reserve(json.size());
      for (const auto& item : json) {
        PD_ASSIGN_OR_RETURN(Value v, FromJson(item, max_depth - 1));
        items.push_back(std::move(v));
      }
      return List(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      ValueDict items;
      items.reserve(json.size());
      for (const auto& [key, item] : json.items()) {
        PD_ASSIGN_OR_RETURN(Value v, FromJson(item, max_depth - 1));
        items.emplace_back(key, std::move(v));
      }
      return Dict(std::move(items));
    }
    case nlohmann::ordered_json::value_t::binary:
      return Status::InvalidArgument("binary JSON values are not supported");
  }
  return None();
}

size_t CodePointCount(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

std::vector<size_t> CodePointOffsets(std::string_view s) {
  std::vector<size_t> offsets;
  offsets.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) offsets.push_back(i);
  }
  offsets.push_back(s.size());
  return offsets;
}

namespace {

// UTF-8 length of the whitespace code point at the start of `s`, else 0 (see PySpaceAt).
size_t SpaceLength(std::string_view s) {
  if (s.empty()) return 0;
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char c = b(0);
  if (c < 0x80) return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) ? 1 : 0;
  if (s.size() >= 2 && c == 0xC2) return b(1) == 0x85 || b(1) == 0xA0 ? 2 : 0;
  if (s.size() < 3) return 0;
  const unsigned char c1 = b(1), c2 = b(2);
  if (c == 0xE1) return c1 == 0x9A && c2 == 0x80 ? 3 : 0;  // U+1680
  if (c == 0xE2 && c1 == 0x80) {                           // U+2000-200A, 2028, 2029, 202F
    return c2 <= 0x8A || c2 == 0xA8 || c2 == 0xA9 || c2 == 0xAF ? 3 : 0;
  }
  if (c == 0xE2) return c1 == 0x81 && c2 == 0x9F ? 3 : 0;  // U+205F
  if (c == 0xE3) return c1 == 0x80 && c2 == 0x80 ? 3 : 0;  // U+3000
  return 0;
}

}  // namespace

size_t PySpaceAt(std::string_view s, size_t at) {
  return at < s.size() ? SpaceLength(s.substr(at)) : 0;
}

size_t PySpaceBefore(std::string_view s, size_t end) {
  end = std::min(end, s.size());
  // Whitespace code points are 1 to 3 bytes long.
  for (size_t len = 1; len <= 3 && len <= end; ++len) {
    if (SpaceLength(s.substr(end - len, len)) == len) return len;
  }
  return 0;
}

}  // namespace pdserve::jinja
