#include "chat/jinja_lexer.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <string>

#include "chat/jinja_value.h"

namespace pdserve::jinja {
namespace {

bool IsIdentStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool IsIdentChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

void AppendUtf8(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xC0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xE0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    *out += static_cast<char>(0xF0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

class Lexer {
 public:
  explicit Lexer(std::string_view src) : src_(src) {
    for (size_t i = 0; i < src.size(); ++i) {
      if (src[i] == '\n') newlines_.push_back(i);
    }
  }

  Result<std::vector<Token>> Run() {
    size_t pos = 0;
    while (pos < src_.size()) {
      size_t tag = FindTag(pos);
      EmitText(pos, tag);
      if (tag == src_.size()) break;
      PD_ASSIGN_OR_RETURN(pos, LexTag(tag));
    }
    Token eof;
    eof.type = Token::Type::kEof;
    SetPos(&eof, src_.size());
    tokens_.push_back(std::move(eof));
    return std::move(tokens_);
  }

 private:
  size_t FindTag(size_t pos) const {
    while (true) {
      size_t p = src_.find('{', pos);
      if (p == std::string_view::npos || p + 1 >= src_.size()) return src_.size();
      char c = src_[p + 1];
      if (c == '{' || c == '%' || c == '#') return p;
      pos = p + 1;
    }
  }

  // Text [begin, tag) with the previous tag's right-side and this tag's left-side whitespace
  // control applied.
  void EmitText(size_t begin, size_t tag) {
    size_t end = tag;
    // Whitespace control ('-') strips what Python's str.isspace() calls whitespace, as Jinja's
    // rstrip() and \s do.
    if (strip_next_) {
      while (size_t n = begin < end ? PySpaceAt(src_, begin) : 0) begin += n;
    } else if (trim_newline_) {
      if (begin < end && src_[begin] == '\n') ++begin;
    }
    strip_next_ = trim_newline_ = false;
    if (tag < src_.size()) {
      char kind = src_[tag + 1];
      char mod = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      if (mod == '-') {
        while (size_t n = end > begin ? PySpaceBefore(src_, end) : 0) end -= n;
      } else if ((kind == '%' || kind == '#') && mod != '+') {
        // lstrip_blocks: drop spaces and tabs between the line start and a block tag.
        size_t line_start = end;
        while (line_start > begin &&
               (src_[line_start - 1] == ' ' || src_[line_start - 1] == '\t')) {
          --line_start;
        }
        bool at_line_start = line_start == 0 || src_[line_start - 1] == '\n';
        if (at_line_start) end = line_start;
      }
    }
    if (end > begin) {
      Token t;
      t.type = Token::Type::kText;
      t.text = std::string(src_.substr(begin, end - begin));
      SetPos(&t, begin);
      tokens_.push_back(std::move(t));
    }
  }

  // Lexes the tag at `tag`; returns the position after it.
  Result<size_t> LexTag(size_t tag) {
    char kind = src_[tag + 1];
    size_t pos = tag + 2;
    if (pos < src_.size() && (src_[pos] == '-' || src_[pos] == '+')) ++pos;
    if (kind == '#') {
      size_t end = src_.find("#}", pos);
      if (end == std::string_view::npos) return Error(tag, "unterminated comment");
      SetRightControl(end > pos && src_[end - 1] == '-', /*block=*/true);
      return end + 2;
    }
    bool block = kind == '%';
    depth_ = 0;
    Token begin;
    begin.type = block ? Token::Type::kBlockBegin : Token::Type::kVarBegin;
    SetPos(&begin, tag);
    tokens_.push_back(std::move(begin));
    const std::string_view close = block ? "%}" : "}}";
    while (true) {
      while (size_t n = PySpaceAt(src_, pos)) pos += n;
      if (pos >= src_.size())
        return Error(tag, block ? "unterminated '{%' tag" : "unterminated '{{'");
      // Like Jinja, a closing delimiter only counts outside brackets ("{{ {'a': {}} }}").
      bool dash = depth_ == 0 && src_[pos] == '-' && src_.substr(pos + 1, 2) == close;
      bool plus = depth_ == 0 && src_[pos] == '+' && src_.substr(pos + 1, 2) == close;
      if (dash || plus || (depth_ == 0 && src_.substr(pos, 2) == close)) {
        Token end;
        end.type = block ? Token::Type::kBlockEnd : Token::Type::kVarEnd;
        SetPos(&end, pos);
        tokens_.push_back(std::move(end));
        SetRightControl(dash, block && !plus);
        return pos + (dash || plus ? 3 : 2);
      }
      PD_ASSIGN_OR_RETURN(pos, LexToken(pos));
    }
  }

  void SetRightControl(bool dash, bool block) {
    strip_next_ = dash;
    trim_newline_ = !dash && block;  // trim_blocks
  }

  Result<size_t> LexToken(size_t pos) {
    Token t;
    SetPos(&t, pos);
    char c = src_[pos];
    if (IsIdentStart(c)) {
      size_t end = pos;
      while (end < src_.size() && IsIdentChar(src_[end])) ++end;
      t.type = Token::Type::kName;
      t.text = std::string(src_.substr(pos, end - pos));
      tokens_.push_back(std::move(t));
      return end;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) return LexNumber(pos, std::move(t));
    if (c == '\'' || c == '"') return LexString(pos, std::move(t));
    static constexpr std::string_view kTwoCharOps[] = {"**", "//", "==", "!=", "<=", ">="};
    for (std::string_view op : kTwoCharOps) {
      if (src_.substr(pos, 2) == op) {
        t.type = Token::Type::kOp;
        t.text = std::string(op);
        tokens_.push_back(std::move(t));
        return pos + 2;
      }
    }
    if (std::string_view("+-*/%~<>=()[]{}.,:|").find(c) != std::string_view::npos) {
      if (c == '(' || c == '[' || c == '{') ++depth_;
      if ((c == ')' || c == ']' || c == '}') && depth_ > 0) --depth_;
      t.type = Token::Type::kOp;
      t.text = std::string(1, c);
      tokens_.push_back(std::move(t));
      return pos + 1;
    }
    return Error(pos, std::string("unexpected character '") + c + "'");
  }

  Result<size_t> LexNumber(size_t pos, Token t) {
    size_t end = pos;
    while (end < src_.size() && std::isdigit(static_cast<unsigned char>(src_[end]))) ++end;
    bool is_float = false;
    if (end + 1 < src_.size() && src_[end] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[end + 1]))) {
      is_float = true;
      ++end;
      while (end < src_.size() && std::isdigit(static_cast<unsigned char>(src_[end]))) ++end;
    }
    if (end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
      size_t e = end + 1;
      if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
      if (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) {
        is_float = true;
        end = e;
        while (end < src_.size() && std::isdigit(static_cast<unsigned char>(src_[end]))) ++end;
      }
    }
    std::string text(src_.substr(pos, end - pos));
    errno = 0;
    if (is_float) {
      t.type = Token::Type::kFloat;
      t.float_value = std::strtod(text.c_str(), nullptr);
    } else {
      t.type = Token::Type::kInt;
      t.int_value = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) return Error(pos, "integer literal out of range");
    }
    tokens_.push_back(std::move(t));
    return end;
  }

  Result<size_t> LexString(size_t pos, Token t) {
    char quote = src_[pos];
    std::string value;
    size_t i = pos + 1;
    while (true) {
      if (i >= src_.size()) return Error(pos, "unterminated string literal");
      char c = src_[i];
      if (c == quote) break;
      if (c != '\\') {
        value += c;
        ++i;
        continue;
      }
      if (i + 1 >= src_.size()) return Error(pos, "unterminated string literal");
      char e = src_[i + 1];
      i += 2;
      switch (e) {
        case 'n':
          value += '\n';
          break;
        case 't':
          value += '\t';
          break;
        case 'r':
          value += '\r';
          break;
        case '0':
          value += '\0';
          break;
        case '\\':
        case '\'':
        case '"':
          value += e;
          break;
        case 'x':
        case 'u':
        case 'U': {
          size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (i + digits > src_.size()) return Error(pos, "truncated escape in string literal");
          std::string hex(src_.substr(i, digits));
          char* parse_end = nullptr;
          unsigned long cp = std::strtoul(hex.c_str(), &parse_end, 16);
          if (parse_end != hex.c_str() + digits || cp > 0x10FFFF) {
            return Error(i, "bad escape in string literal");
          }
          AppendUtf8(&value, static_cast<uint32_t>(cp));
          i += digits;
          break;
        }
        case '\n':
          break;  // line continuation
        default:
          // Python keeps unknown escapes as written.
          value += '\\';
          value += e;
      }
    }
    t.type = Token::Type::kString;
    t.text = std::move(value);
    tokens_.push_back(std::move(t));
    return i + 1;
  }

  void SetPos(Token* t, size_t offset) const {
    auto it = std::lower_bound(newlines_.begin(), newlines_.end(), offset);
    t->line = static_cast<int>(it - newlines_.begin()) + 1;
    size_t line_start = it == newlines_.begin() ? 0 : *(it - 1) + 1;
    t->col = static_cast<int>(offset - line_start) + 1;
  }

  Status Error(size_t offset, const std::string& what) const {
    Token t;
    SetPos(&t, offset);
    return Status::InvalidArgument("line " + std::to_string(t.line) + " col " +
                                   std::to_string(t.col) + ": " + what);
  }

  std::string_view src_;
  std::vector<size_t> newlines_;
  std::vector<Token> tokens_;
  bool strip_next_ = false;
  bool trim_newline_ = false;
  int depth_ = 0;  // open brackets in the current tag
};

}  // namespace

Result<std::vector<Token>> Tokenize(std::string_view source) {
  // As Jinja's lexer: line endings \r\n and \r become \n, and one trailing newline of the
  // template is dropped (keep_trailing_newline=False).
  std::string normalized;
  normalized.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      normalized += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      normalized += source[i];
    }
  }
  if (!normalized.empty() && normalized.back() == '\n') normalized.pop_back();
  return Lexer(normalized).Run();
}

}  // namespace pdserve::jinja
