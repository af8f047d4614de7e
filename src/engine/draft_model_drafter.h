// DraftModelDrafter: speculative decoding's drafter as a smaller model of the same vocabulary
// (`serve --speculative draft --draft-model DIR`). It runs the draft model on the engine's loop
// thread, one rank (the draft is small; its logits are the same bits whatever the target's
// TP), over a paged KV cache and page pool of its own, as many pages as the target's: a
// sequence never holds more draft pages than target pages, so drafting never waits for pages.
// Loop thread only (Drafter).
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "engine/drafter.h"
#include "kv/kv_cache.h"
#include "kv/page_pool.h"
#include "model/transformer.h"
#include "tokenizer/tokenizer.h"

namespace pdserve {

// Whether `draft` can draft for `target`: the same vocabulary size (the drafts are target ids
// and, when sampling, the two distributions are compared id by id) and, where both have a
// tokenizer, the same tokens: every id the same bytes and the same special-ness, the same BOS
// and EOS. FailedPrecondition naming the first difference otherwise. Other config values
// (layers, heads, context) may differ; the draft's shorter context only stops it drafting.
Status CheckDraftCompatible(const ModelConfig& target, const Tokenizer* target_tokenizer,
                            const ModelConfig& draft, const Tokenizer* draft_tokenizer);

class DraftModelDrafter : public Drafter {
 public:
  // The model must be rank 0 of 1. Checks the vocabulary size only (CheckDraftCompatible also
  // compares tokenizers, which the caller has).
  static Result<std::unique_ptr<DraftModelDrafter>> Create(std::unique_ptr<Transformer> draft,
                                                           const ModelConfig& target);

  Status CreateCache(int num_pages, int page_tokens) override;
  Status Propose(std::span<const DraftWish> wishes) override;
  void Rollback(Sequence& seq, int64_t valid) override;
  void Release(Sequence& seq) override;
  const PagePool* page_pool() const override { return pool_.get(); }
  const Transformer& model() const { return *model_; }

 private:
  explicit DraftModelDrafter(std::unique_ptr<Transformer> model) : model_(std::move(model)) {}

  std::unique_ptr<Transformer> model_;
  std::unique_ptr<KvCache> cache_;  // CreateCache
  std::unique_ptr<PagePool> pool_;
  std::vector<float> logits_;
};

}  // namespace pdserve
