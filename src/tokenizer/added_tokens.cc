#include "tokenizer/added_tokens.h"

#include <algorithm>
#include <utility>

#include "tokenizer/utf8.h"

namespace pdserve {

AddedTokenMatcher::AddedTokenMatcher(std::vector<Token> tokens) : tokens_(std::move(tokens)) {
  std::erase_if(tokens_, [](const Token& t) { return t.content.empty(); });
  std::stable_sort(tokens_.begin(), tokens_.end(), [](const Token& a, const Token& b) {
    return a.content.size() > b.content.size();
  });
  for (size_t i = 0; i < tokens_.size(); ++i) {
    by_first_byte_[static_cast<unsigned char>(tokens_[i].content[0])].push_back(
        static_cast<uint32_t>(i));
  }
}

const AddedTokenMatcher::Token* AddedTokenMatcher::MatchAt(std::string_view text,
                                                           size_t pos) const {
  for (uint32_t i : by_first_byte_[static_cast<unsigned char>(text[pos])]) {
    if (text.substr(pos).starts_with(tokens_[i].content)) return &tokens_[i];
  }
  return nullptr;
}

void AddedTokenMatcher::Encode(std::string_view text, const PlainEncoder& encode_plain,
                               std::vector<int32_t>& ids) const {
  auto plain = [&](size_t begin, size_t end) {
    if (end > begin) encode_plain(text.substr(begin, end - begin), ids);
  };
  size_t segment_start = 0;
  for (size_t pos = 0; pos < text.size();) {
    const Token* token = MatchAt(text, pos);
    if (token == nullptr) {
      ++pos;
      continue;
    }
    size_t segment_end = pos;
    if (token->lstrip) {
      while (segment_end > segment_start && utf8::IsAsciiSpace(text[segment_end - 1]))
        --segment_end;
    }
    plain(segment_start, segment_end);
    ids.push_back(token->id);
    pos += token->content.size();
    if (token->rstrip) {
      while (pos < text.size() && utf8::IsAsciiSpace(text[pos])) ++pos;
    }
    segment_start = pos;
  }
  plain(segment_start, text.size());
}

}  // namespace pdserve
