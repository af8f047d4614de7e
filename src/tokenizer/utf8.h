// UTF-8 helpers for the tokenizers: decoding one code point with validation, encoding, and
// finding where a byte string stops being complete UTF-8. Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace pdserve::utf8 {

inline constexpr char32_t kReplacement = 0xFFFD;

// True for the ASCII whitespace bytes (space, \t, \n, \r, \f, \v: C's isspace in the "C"
// locale), whatever the process's locale.
inline bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// Outcome of decoding the code point that starts at a position.
struct Decoded {
  enum class Kind : uint8_t {
    kValid,       // `cp` and `length` describe a well-formed character
    kIncomplete,  // a valid prefix that runs into the end of the input
    kInvalid,     // ill-formed; `length` bytes (>= 1) form the maximal invalid subpart
  };
  Kind kind;
  char32_t cp;
  size_t length;
};

// Decodes the character at text[pos]. Precondition: pos < text.size().
// Follows the Unicode "maximal subpart" rule, so replacement-character output matches
// what other decoders (Python, Rust) produce.
Decoded DecodeAt(std::string_view text, size_t pos);

// Appends the UTF-8 encoding of cp (a scalar value; surrogates and values > 0x10FFFF become
// U+FFFD).
void Append(char32_t cp, std::string& out);

// True if the whole string is well-formed UTF-8.
bool IsValid(std::string_view text);

// Replaces every ill-formed or incomplete sequence with U+FFFD.
std::string Sanitize(std::string_view text);

}  // namespace pdserve::utf8
