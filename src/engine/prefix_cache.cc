#include "engine/prefix_cache.h"

#include <algorithm>
#include <vector>

namespace pdserve {

PrefixCache::PrefixCache(PagePool* pool, bool enabled, std::string_view salt, int page_tokens)
    : pool_(pool), enabled_(enabled), hasher_(salt, page_tokens) {}

PrefixCache::Hit PrefixCache::Acquire(Sequence* seq) {
  if (!enabled_ || !seq->table.pages().empty() || seq->num_computed != 0) return {};
  const int page_tokens = hasher_.page_tokens();
  const size_t max_pages = static_cast<size_t>((seq->prefill_target() - 1) / page_tokens);
  hasher_.Extend(seq->tokens, max_pages, &seq->page_hashes);
  const std::span<const PageHash> hashes = std::span<const PageHash>(seq->page_hashes)
                                               .first(std::min(max_pages, seq->page_hashes.size()));
  const std::vector<PageId> pages =
      pool_->AcquireCached(hashes, hasher_.seed(), seq->tokens, page_tokens);
  seq->table.AppendCached(pages);
  seq->num_computed = static_cast<int64_t>(pages.size()) * page_tokens;
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
}

void PrefixCache::Seal(Sequence* seq) {
  // Positions [0, num_computed) hold final KV — but a sequence that verifies drafted tokens and
  // finishes in that step (Engine::ProcessLogits) still counts every drafted position computed.
  // Its accepted ones stop before its last token, which no step has run yet: one less is safe.
  int64_t final_tokens = std::min(seq->num_computed, seq->num_tokens());
  if (seq->spec_tokens > 0) final_tokens = std::min(final_tokens, seq->num_tokens() - 1);
  const int page_tokens = hasher_.page_tokens();
  const int full = static_cast<int>(std::min<int64_t>(
      final_tokens / page_tokens, static_cast<int64_t>(seq->table.pages().size())));
  const int sealed = seq->table.sealed_pages();
  if (full <= sealed) return;
  if (enabled_) {
    hasher_.Extend(seq->tokens, static_cast<size_t>(full), &seq->page_hashes);
    const std::span<const PageId> pages = seq->table.pages();
    for (int i = sealed; i < full; ++i) {
      const PageHash& parent = i == 0 ? hasher_.seed() : seq->page_hashes[i - 1];
      pool_->Register(pages[i], seq->page_hashes[i], parent,
                      std::span<const int32_t>(seq->tokens)
                          .subspan(static_cast<size_t>(i) * page_tokens, page_tokens));
    }
  }
  seq->table.Seal(full);
}

int64_t PrefixCache::CachedTokens(std::span<const int32_t> tokens) const {
  if (!enabled_) return 0;
  std::vector<PageHash> hashes;
  hasher_.Extend(tokens, tokens.size() / hasher_.page_tokens(), &hashes);
  return static_cast<int64_t>(
             pool_->CachedPrefixPages(hashes, hasher_.seed(), tokens, hasher_.page_tokens())) *
         hasher_.page_tokens();
}

}  // namespace pdserve
