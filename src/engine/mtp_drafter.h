// MtpDrafter: speculative decoding's drafter as the target model's own MTP module
// (`serve --speculative mtp`, DeepSeek-V3/R1; Transformer::ForwardMtp). It holds no cache of its
// own: the module's KV is layer num_layers of the target's cache, in the sequence's own pages,
// so the target's pages, rollback and transfers carry it.
//
// What it keeps per sequence is Sequence::mtp_hidden: the target's final-normed hidden state of
// position num_computed - 1. The target's passes write the module's KV for every position whose
// next token is known (SequenceChunk::mtp_tokens: the next prompt token, or the next draft,
// valid as far as verification keeps the drafts), and return that hidden state. A step's drafts
// then chain the module from it: pass 1 combines it with the pending token (position
// num_computed - 1, whose entry is then final: Sequence::mtp_final) and drafts d1; pass j
// combines pass j-1's output hidden state with d_{j-1} one position further and drafts d_j.
// Every pass runs module 0, as vLLM and SGLang do with DeepSeek's one module (a checkpoint with
// more modules drafts with its first). With TP every rank runs each pass (the engine publishes
// it). Loop thread only (Drafter).
#pragma once

#include <functional>
#include <span>
#include <vector>

#include "engine/drafter.h"
#include "model/forward_pass.h"

namespace pdserve {

class MtpDrafter : public Drafter {
 public:
  // Runs one MTP pass on every rank (Transformer::ForwardMtp's arguments, less the cache).
  using RunPass =
      std::function<Status(std::span<const SequenceChunk> chunks, std::span<const float> hidden_in,
                           std::vector<float>* logits, std::vector<float>* hidden_out)>;
  MtpDrafter(int hidden_size, int vocab_size, RunPass run)
      : hidden_size_(hidden_size), vocab_size_(vocab_size), run_(std::move(run)) {}

  Status CreateCache(int /*num_pages*/, int /*page_tokens*/) override { return Status::Ok(); }
  Status Propose(std::span<const DraftWish> wishes) override;
  // Positions past `valid` are rewritten before any pass reads them: nothing to undo.
  void Rollback(Sequence& /*seq*/, int64_t /*valid*/) override {}
  void Release(Sequence& seq) override;
  const PagePool* page_pool() const override { return nullptr; }

 private:
  int hidden_size_;
  int vocab_size_;
  RunPass run_;
  std::vector<float> hidden_in_, hidden_out_, logits_;
};

}  // namespace pdserve
