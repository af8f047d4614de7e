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

PrefixHasher::PrefixHasher(std::string_view salt, int page_tokens) : page_tokens_(page_tokens) {
  PD_CHECK(page_tokens >= 1);
  ByteWriter w;
  w.Raw("pdserve prefix cache v1");
  w.Bytes(salt);
  w.U32(static_cast<uint32_t>(page_tokens));
  const std::string bytes = w.Take();
  seed_ = Truncate128(Sha256Hash(bytes));
}

PageHash PrefixHasher::Chain(const PageHash& parent, std::span<const int32_t> page) const {
  PD_CHECK(static_cast<int>(page.size()) == page_tokens_);
  ByteWriter w;
  w.U64(parent.hi);
  w.U64(parent.lo);
  w.I32s(page);
  const std::string bytes = w.Take();
  return Truncate128(Sha256Hash(bytes));
}

void PrefixHasher::Extend(std::span<const int32_t> tokens, size_t pages,
                          std::vector<PageHash>* hashes) const {
  const size_t full = tokens.size() / static_cast<size_t>(page_tokens_);
  for (size_t i = hashes->size(); i < std::min(pages, full); ++i) {
    const PageHash& parent = i == 0 ? seed_ : (*hashes)[i - 1];
    hashes->push_back(Chain(parent, tokens.subspan(i * page_tokens_, page_tokens_)));
  }
}

}  // namespace pdserve
