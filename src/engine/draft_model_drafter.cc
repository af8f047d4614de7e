#include "engine/draft_model_drafter.h"

#include <algorithm>

#include <fmt/format.h>

#include "engine/sequence.h"
#include "engine/spec_sampling.h"

namespace pdserve {

Status CheckDraftCompatible(const ModelConfig& target, const Tokenizer* target_tokenizer,
                            const ModelConfig& draft, const Tokenizer* draft_tokenizer) {
  if (target.vocab_size != draft.vocab_size) {
    return Status::FailedPrecondition(
        fmt::format("the draft model's vocabulary has {} ids, the target's {}: a draft model "
                    "must share the target's vocabulary",
                    draft.vocab_size, target.vocab_size));
  }
  if (target_tokenizer == nullptr || draft_tokenizer == nullptr) return Status::Ok();
  const Tokenizer& t = *target_tokenizer;
  const Tokenizer& d = *draft_tokenizer;
  if (t.vocab_size() != d.vocab_size()) {
    return Status::FailedPrecondition(
        fmt::format("the draft model's tokenizer has {} tokens, the target's {}", d.vocab_size(),
                    t.vocab_size()));
  }
  for (int32_t id = 0; id < t.vocab_size(); ++id) {
    if (t.TokenBytes(id) != d.TokenBytes(id) || t.IsSpecial(id) != d.IsSpecial(id)) {
      return Status::FailedPrecondition(
          fmt::format("token {} differs between the draft model's tokenizer and the target's "
                      "({:?} vs {:?})",
                      id, d.TokenBytes(id), t.TokenBytes(id)));
    }
  }
  if (t.bos_id() != d.bos_id() || t.eos_ids() != d.eos_ids()) {
    return Status::FailedPrecondition(
        "the draft model's tokenizer has other BOS or EOS tokens than the target's");
  }
  return Status::Ok();
}

Result<std::unique_ptr<DraftModelDrafter>> DraftModelDrafter::Create(
    std::unique_ptr<Transformer> draft, const ModelConfig& target) {
  if (draft == nullptr) return Status::InvalidArgument("no draft model");
  if (draft->tp().size != 1) {
    return Status::InvalidArgument("the draft model runs as one rank (TP 1)");
  }
  PD_RETURN_IF_ERROR(CheckDraftCompatible(target, nullptr, draft->config(), nullptr));
  return std::unique_ptr<DraftModelDrafter>(new DraftModelDrafter(std::move(draft)));
}

Status DraftModelDrafter::CreateCache(int num_pages, int page_tokens) {
  PD_ASSIGN_OR_RETURN(cache_, KvCache::Create(model_->MakeKvLayout(num_pages, page_tokens)));
  pool_ = std::make_unique<PagePool>(num_pages);
  return Status::Ok();
}

Status DraftModelDrafter::Propose(std::span<const DraftWish> wishes) {
  // Pass 1 runs, per sequence, every token the draft cache lacks (the whole prompt at the first
  // step, then what the last verification added) and drafts d1; pass j feeds d_{j-1} at
  // position n + j - 2 (n tokens in the sequence) and drafts d_j.
  struct Active {
    Sequence* seq;
    int want;
  };
  std::vector<Active> active;
  std::vector<SequenceChunk> chunks;
  const int64_t context = model_->config().MaxContext();
  for (const DraftWish& w : wishes) {
    Sequence& seq = *w.seq;
    seq.drafts.clear();
    const int64_t n = seq.num_tokens();
    // Fed tokens reach position n + want - 2: pages for n + want - 1 tokens.
    int want = static_cast<int>(std::min<int64_t>(w.tokens, context - n + 1));
    while (want > 0 && !seq.draft_table.EnsureCapacity(*pool_, n + want - 1).ok()) --want;
    if (want <= 0) continue;
    seq.drafts.reserve(want);  // the chunks below point into it
    chunks.push_back({.tokens = std::span<const int32_t>(seq.tokens).subspan(seq.draft_computed),
                      .start = seq.draft_computed,
                      .pages = seq.draft_table.pages(),
                      .want_logits = true});
    active.push_back({&seq, want});
  }
  const int vocab = model_->config().vocab_size;
  while (!active.empty()) {
    Status s = model_->Forward(chunks, *cache_, &logits_);
    if (!s.ok()) {
      for (const DraftWish& w : wishes) w.seq->drafts.clear();
      return s.WithContext("draft model");
    }
    std::vector<Active> next;
    std::vector<SequenceChunk> next_chunks;
    for (size_t i = 0; i < active.size(); ++i) {
      Sequence& seq = *active[i].seq;
      seq.draft_computed = chunks[i].start + static_cast<int64_t>(chunks[i].tokens.size());
      const std::span<const float> row(&logits_[i * static_cast<size_t>(vocab)], vocab);
      seq.drafts.push_back(PickDraftToken(seq, row));
      if (static_cast<int>(seq.drafts.size()) == active[i].want) continue;
      next_chunks.push_back({.tokens = std::span<const int32_t>(&seq.drafts.back(), 1),
                             .start = seq.draft_computed,
                             .pages = seq.draft_table.pages(),
                             .want_logits = true});
      next.push_back(active[i]);
    }
    active.swap(next);
    chunks.swap(next_chunks);
  }
  return Status::Ok();
}

void DraftModelDrafter::Rollback(Sequence& seq, int64_t valid) {
  seq.draft_computed = std::min(seq.draft_computed, valid);
  seq.draft_table.Truncate(*pool_, seq.draft_computed);
}

void DraftModelDrafter::Release(Sequence& seq) {
  seq.draft_table.Release(*pool_);
  seq.draft_computed = 0;
  seq.drafts.clear();
}

}  // namespace pdserve
