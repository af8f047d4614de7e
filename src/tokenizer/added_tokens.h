// AddedTokenMatcher: finds added and special tokens written literally in the text (e.g.
// "<|im_start|>", "</s>") before the text is normalized and split, leftmost first and the
// longest token at a position first, as Hugging Face tokenizers do. Shared by both tokenizer
// implementations. Immutable after construction; thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace pdserve {

class AddedTokenMatcher {
 public:
  struct Token {
    std::string content;  // non-empty
    int32_t id;
    bool lstrip = false;  // swallow the whitespace just before the token
    bool rstrip = false;  // swallow the whitespace just after the token
  };
  // Encodes a segment of text that holds no added token, appending to ids.
  using PlainEncoder = std::function<void(std::string_view, std::vector<int32_t>&)>;

  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(std::vector<Token> tokens);

  // Appends the ids of `text` to `ids`: matched tokens as their id, the text between them
  // through `encode_plain` (called for non-empty segments only).
  void Encode(std::string_view text, const PlainEncoder& encode_plain,
              std::vector<int32_t>& ids) const;

 private:
  const Token* MatchAt(std::string_view text, size_t pos) const;

  std::vector<Token> tokens_;  // longest first
  // Indices into tokens_ by the first byte of their content, so most positions cost one
  // array lookup.
  std::array<std::vector<uint32_t>, 256> by_first_byte_;
};

}  // namespace pdserve
