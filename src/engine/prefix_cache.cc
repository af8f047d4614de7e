#include "engine/prefix_cache.h"

#include <algorithm>
#include <vector>

#include "common/check.h"

namespace pdserve {

PrefixCache::PrefixCache(PagePool* pool, bool enabled, std::string_view salt, int page_tokens,
                         bool mtp_kv)
    : pool_(pool),
      enabled_(enabled),
      mtp_kv_(mtp_kv),
      hasher_(salt, page_tokens, /*lookahead=*/mtp_kv ? 1 : 0) {}

PrefixCache::Hit PrefixCache::Acquire(Sequence* seq) {
  if (!enabled_ || !seq->table.pages().empty() || seq->num_computed != 0) return {};
  const int page_tokens = hasher_.page_tokens();
  const size_t max_pages = static_cast<size_t>((seq->prefill_target() - 1) / page_tokens);
  hasher_.Extend(seq->tokens, max_pages, &seq->page_hashes);
  const std::span<const PageHash> hashes = std::span<const PageHash>(seq->page_hashes)
                                               .first(std::min(max_pages, seq->page_hashes.size()));
  const std::vector<PageId> pages = pool_->AcquireCached(hashes, hasher_, seq->tokens);
  seq->table.AppendCached(pages);
  seq->num_computed = static_cast<int64_t>(pages.size()) * page_tokens;
  seq->mtp_final = seq->num_computed;  // a registered page's entries are final
  return {.queried = true, .tokens = seq->num_computed};
}

void PrefixCache::CountAdmission(Sequence* seq, const Hit& hit) {
  if (!hit.queried || seq->prefix_counted) return;
  seq->prefix_counted = true;
  queries_.fetch_add(seq->num_tokens(), std::memory_order_relaxed);
  hits_.fetch_add(hit.tokens, std::memory_order_relaxed);
}

void PrefixCache::Return(Sequence* seq, const Hit& hit) {
  if (hit.tokens == 0) return;
  seq->table.Release(*pool_);
  seq->num_computed = 0;
  seq->mtp_final = 0;
}

void PrefixCache::Seal(Sequence* seq) {
  // Positions [0, num_computed) hold final KV — but a sequence that verifies drafted tokens and
  // finishes in that step (Engine::ProcessLogits) still counts every drafted position computed.
  // Its accepted ones stop before its last token, which no step has run yet: one less is safe.
  int64_t final_tokens = std::min(seq->num_computed, seq->num_tokens());
  if (seq->spec_tokens > 0) final_tokens = std::min(final_tokens, seq->num_tokens() - 1);
  // With the MTP layer a page is final once its module entries are (mtp_final: at most
  // num_computed - 1, as the last computed position's entry needs the token after it). Then a
  // sealed page's lookahead token, at most mtp_final, is known: it has a hash.
  if (mtp_kv_) final_tokens = std::min(final_tokens, seq->mtp_final);
  const int page_tokens = hasher_.page_tokens();
  const int full = static_cast<int>(std::min<int64_t>(
      final_tokens / page_tokens, static_cast<int64_t>(seq->table.pages().size())));
  const int sealed = seq->table.sealed_pages();
  if (full <= sealed) return;
  if (enabled_) {
    hasher_.Extend(seq->tokens, static_cast<size_t>(full), &seq->page_hashes);
    PD_CHECK(seq->page_hashes.size() >= static_cast<size_t>(full));
    const std::span<const PageId> pages = seq->table.pages();
    for (int i = sealed; i < full; ++i) {
      const PageHash& parent = i == 0 ? hasher_.seed() : seq->page_hashes[i - 1];
      pool_->Register(pages[i], seq->page_hashes[i], parent,
                      hasher_.IdentityOf(seq->tokens, static_cast<size_t>(i)));
    }
  }
  seq->table.Seal(full);
}

int64_t PrefixCache::CachedTokens(std::span<const int32_t> tokens) const {
  if (!enabled_) return 0;
  std::vector<PageHash> hashes;
  hasher_.Extend(tokens, hasher_.HashablePages(tokens.size()), &hashes);
  return static_cast<int64_t>(pool_->CachedPrefixPages(hashes, hasher_, tokens)) *
         hasher_.page_tokens();
}

}  // namespace pdserve
