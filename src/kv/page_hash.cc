#include "kv/page_hash.h"

#include <algorithm>
#include <string>

#include "common/byte_codec.h"
#include "common/check.h"
#include "common/sha256.h"

namespace pdserve {
namespace {

// The first 128 bits of a digest, big-endian.
PageHash Truncate128(const Sha256Digest& d) {
  PageHash h;
  for (int i = 0; i < 8; ++i) {
    h.hi = (h.hi << 8) | d[i];
    h.lo = (h.lo << 8) | d[8 + i];
  }
  return h;
}

}  // namespace

PrefixHasher::PrefixHasher(std::string_view salt, int page_tokens, int lookahead)
    : page_tokens_(page_tokens), lookahead_(lookahead) {
  PD_CHECK(page_tokens >= 1 && lookahead >= 0);
  ByteWriter w;
  w.Raw("pdserve prefix cache v1");
  w.Bytes(salt);
  w.U32(static_cast<uint32_t>(page_tokens));
  // Only when there is one: the seeds (and so every hash) without a lookahead stay as they were.
  if (lookahead > 0) {
    w.Raw("lookahead");
    w.U32(static_cast<uint32_t>(lookahead));
  }
  const std::string bytes = w.Take();
  seed_ = Truncate128(Sha256Hash(bytes));
}

PageHash PrefixHasher::Chain(const PageHash& parent, std::span<const int32_t> page) const {
  PD_CHECK(static_cast<int>(page.size()) == identity_tokens());
  ByteWriter w;
  w.U64(parent.hi);
  w.U64(parent.lo);
  w.I32s(page);
  const std::string bytes = w.Take();
  return Truncate128(Sha256Hash(bytes));
}

std::span<const int32_t> PrefixHasher::IdentityOf(std::span<const int32_t> tokens,
                                                  size_t page) const {
  return tokens.subspan(page * static_cast<size_t>(page_tokens_),
                        static_cast<size_t>(identity_tokens()));
}

size_t PrefixHasher::HashablePages(size_t tokens) const {
  const size_t lookahead = static_cast<size_t>(lookahead_);
  return tokens < lookahead ? 0 : (tokens - lookahead) / static_cast<size_t>(page_tokens_);
}

void PrefixHasher::Extend(std::span<const int32_t> tokens, size_t pages,
                          std::vector<PageHash>* hashes) const {
  const size_t hashable = HashablePages(tokens.size());
  for (size_t i = hashes->size(); i < std::min(pages, hashable); ++i) {
    const PageHash& parent = i == 0 ? seed_ : (*hashes)[i - 1];
    hashes->push_back(Chain(parent, IdentityOf(tokens, i)));
  }
}

}  // namespace pdserve
