#include "tokenizer/byte_level.h"

#include <array>

#include "tokenizer/utf8.h"

namespace pdserve::byte_level {
namespace {

// Printable Latin-1 bytes keep their own code point; the other 68 bytes (controls, space,
// DEL, NBSP, soft hyphen, ...) are moved to U+0100 upwards in byte order, as GPT-2 does.
bool KeepsOwnCodePoint(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct Tables {
  std::array<char32_t, 256> to_cp{};
  // Indexed by code point; covers every mapped code point (all are < 0x200).
  std::array<int16_t, 0x200> to_byte{};
  Tables() {
    to_byte.fill(-1);
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      to_cp[b] = KeepsOwnCodePoint(b) ? static_cast<char32_t>(b) : 0x100 + next++;
      to_byte[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const Tables& GetTables() {
  static const Tables tables;
  return tables;
}

}  // namespace

char32_t ByteToCodePoint(unsigned char b) { return GetTables().to_cp[b]; }

std::optional<unsigned char> CodePointToByte(char32_t cp) {
  if (cp >= 0x200) return std::nullopt;
  const int16_t b = GetTables().to_byte[cp];
  if (b < 0) return std::nullopt;
  return static_cast<unsigned char>(b);
}

std::string Encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) utf8::Append(ByteToCodePoint(static_cast<unsigned char>(c)), out);
  return out;
}

std::optional<std::string> Decode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const utf8::Decoded d = utf8::DecodeAt(text, pos);
    if (d.kind != utf8::Decoded::Kind::kValid) return std::nullopt;
    const std::optional<unsigned char> b = CodePointToByte(d.cp);
    if (!b) return std::nullopt;
    out.push_back(static_cast<char>(*b));
    pos += d.length;
  }
  return out;
}

}  // namespace pdserve::byte_level
