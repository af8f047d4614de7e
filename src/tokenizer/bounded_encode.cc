#include "tokenizer/bounded_encode.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace pdserve {
namespace {

// Bytes per allowed token of the first prefix: ordinary text takes ~4 bytes a token, so the
// first prefix usually settles a text over the limit.
constexpr size_t kFirstPrefixBytesPerToken = 8;
constexpr size_t kMinFirstPrefixBytes = 4096;

}  // namespace

size_t PrefixCut(std::string_view text, size_t from, size_t to) {
  if (text.size() < 3) return std::string_view::npos;
  for (size_t i = std::min(to, text.size() - 2); i > from; --i) {
    if (text[i] == ' ' && !utf8::IsAsciiSpace(text[i - 1]) && !utf8::IsAsciiSpace(text[i + 1]))
      return i;
  }
  return std::string_view::npos;
}

std::optional<std::vector<int32_t>> EncodeWithin(const Tokenizer& tokenizer, std::string_view text,
                                                 bool add_special, size_t max_tokens) {
  // Settled by its length alone: each token stands for at most `bound` of its bytes that are
  // not whitespace.
  if (const size_t bound = tokenizer.max_text_bytes_per_token();
      bound > 0 && text.size() / bound > max_tokens) {
    const auto counted = static_cast<size_t>(
        std::count_if(text.begin(), text.end(), [](char c) { return !utf8::IsAsciiSpace(c); }));
    if (counted / bound > max_tokens) return std::nullopt;
  }
  size_t prefix = std::max(kMinFirstPrefixBytes, max_tokens * kFirstPrefixBytesPerToken);
  // Only prefixes well short of the text: otherwise encoding the whole costs as much.
  while (prefix < text.size() / 2) {
    const size_t cut = PrefixCut(text, prefix / 2, prefix);
    if (cut != std::string_view::npos &&
        tokenizer.Encode(text.substr(0, cut), add_special).size() > max_tokens) {
      return std::nullopt;
    }
    prefix *= 2;
  }
  std::vector<int32_t> ids = tokenizer.Encode(text, add_special);
  if (ids.size() > max_tokens) return std::nullopt;
  return ids;
}

}  // namespace pdserve
