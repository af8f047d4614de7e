// The GPT-2 byte-level alphabet: each of the 256 byte values is written as one printable
// Unicode character in byte-level BPE vocabularies (e.g. space -> "Ġ", newline -> "Ċ").
// Pure functions over constant tables; thread-safe.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace pdserve::byte_level {

// The code point that stands for byte b.
char32_t ByteToCodePoint(unsigned char b);
// The byte a code point stands for, if it is one of the 256 alphabet characters.
std::optional<unsigned char> CodePointToByte(char32_t cp);

// Maps raw bytes to their alphabet form (UTF-8 of the mapped code points).
std::string Encode(std::string_view bytes);
// Maps an alphabet string back to raw bytes; nullopt if it holds a character outside the
// alphabet or is not valid UTF-8.
std::optional<std::string> Decode(std::string_view text);

}  // namespace pdserve::byte_level
