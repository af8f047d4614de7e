// Unicode NFC normalization (canonical decomposition, canonical ordering, canonical
// composition, Hangul included) for tokenizers whose tokenizer.json asks for it. Tables are
// generated from the Unicode Character Database by tokenizer_nfc_gen.py. Pure functions;
// thread-safe.
#pragma once

#include <string>
#include <string_view>

namespace pdserve::nfc {

// True if the text is certainly NFC already (a fast scan; all-ASCII text always is).
bool IsQuickNfc(std::string_view valid_utf8);

// The NFC form. Precondition: valid UTF-8 (callers split off invalid bytes first).
std::string Normalize(std::string_view valid_utf8);

}  // namespace pdserve::nfc
