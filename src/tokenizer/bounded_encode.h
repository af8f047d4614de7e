// EncodeWithin: Tokenizer::Encode for a prompt that must fit a context, whose work is bounded by
// that context rather than by the text. A 4 MB prompt sent to a 512-token model used to be
// encoded whole (SentencePiece: ~500 MB and ~2 s) only to be refused afterwards. Safe from any
// thread (the tokenizer is immutable).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace pdserve {

// The ids of `text` (as tokenizer.Encode(text, add_special)) when they number at most
// `max_tokens`, else nullopt. A text with more than max_tokens times the tokenizer's
// max_text_bytes_per_token() bytes other than whitespace is refused at once. Other long texts are
// first encoded in growing prefixes (doubling, from a few bytes per allowed token), each cut just
// before a single space between two non-space characters: there every tokenizer here starts a new
// word (pre-tokenizer split, SentencePiece's whitespace split, NFC never composes across an ASCII
// space), so a prefix's ids are the start of the whole text's ids and a prefix over the limit
// proves the whole text is (an added token that itself holds such a space, should one span the cut,
// could count an id or two more there). The work is then about twice what max_tokens tokens cost. A
// text with no such cut point (no spaces) is encoded whole.
std::optional<std::vector<int32_t>> EncodeWithin(const Tokenizer& tokenizer, std::string_view text,
                                                 bool add_special, size_t max_tokens);

// Where EncodeWithin cuts a prefix: the last position in (from, to] holding a ' ' between two
// non-space characters, or npos.
size_t PrefixCut(std::string_view text, size_t from, size_t to);

}  // namespace pdserve
