#include "tokenizer/utf8.h"

namespace pdserve::utf8 {
namespace {

bool IsContinuation(unsigned char b) { return (b & 0xC0) == 0x80; }

}  // namespace

Decoded DecodeAt(std::string_view text, size_t pos) {
  const auto b0 = static_cast<unsigned char>(text[pos]);
  if (b0 < 0x80) return {Decoded::Kind::kValid, b0, 1};
  size_t need;
  char32_t cp;
  // The allowed range of the second byte depends on the lead byte (excludes overlongs,
  // surrogates and values above U+10FFFF), per Unicode Table 3-7.
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
    cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {Decoded::Kind::kInvalid, kReplacement, 1};
  }
  for (size_t i = 1; i <= need; ++i) {
    if (pos + i >= text.size()) return {Decoded::Kind::kIncomplete, kReplacement, i};
    const auto b = static_cast<unsigned char>(text[pos + i]);
    const bool ok = i == 1 ? (b >= lo && b <= hi) : IsContinuation(b);
    if (!ok) return {Decoded::Kind::kInvalid, kReplacement, i};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {Decoded::Kind::kValid, cp, need + 1};
}

void Append(char32_t cp, std::string& out) {
  if ((cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) cp = kReplacement;
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool IsValid(std::string_view text) {
  for (size_t pos = 0; pos < text.size();) {
    const Decoded d = DecodeAt(text, pos);
    if (d.kind != Decoded::Kind::kValid) return false;
    pos += d.length;
  }
  return true;
}

std::string Sanitize(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const Decoded d = DecodeAt(text, pos);
    if (d.kind == Decoded::Kind::kValid) {
      out.append(text.substr(pos, d.length));
    } else {
      Append(kReplacement, out);
    }
    pos += d.length;
  }
  return out;
}

}  // namespace pdserve::utf8
