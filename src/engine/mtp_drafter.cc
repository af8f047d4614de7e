#include "engine/mtp_drafter.h"

#include <algorithm>

#include "engine/sequence.h"
#include "engine/spec_sampling.h"

namespace pdserve {

Status MtpDrafter::Propose(std::span<const DraftWish> wishes) {
  struct Active {
    Sequence* seq;
    int want;
  };
  std::vector<Active> active;
  std::vector<SequenceChunk> chunks;
  hidden_in_.clear();
  for (const DraftWish& w : wishes) {
    Sequence& seq = *w.seq;
    seq.drafts.clear();
    // Pass 1 needs the hidden state of the position before the pending token (none for a
    // one-token prompt, or where no pass has produced it).
    if (w.tokens <= 0 || seq.num_computed < 1 ||
        seq.mtp_hidden.size() != static_cast<size_t>(hidden_size_)) {
      continue;
    }
    seq.drafts.reserve(w.tokens);  // the chunks below point into it
    chunks.push_back({.tokens = std::span<const int32_t>(seq.tokens).subspan(seq.num_computed, 1),
                      .start = seq.num_computed - 1,
                      .pages = seq.table.pages(),
                      .want_logits = true});
    hidden_in_.insert(hidden_in_.end(), seq.mtp_hidden.begin(), seq.mtp_hidden.end());
    active.push_back({&seq, w.tokens});
  }
  bool first_pass = true;
  while (!active.empty()) {
    if (Status s = run_(chunks, hidden_in_, &logits_, &hidden_out_); !s.ok()) {
      for (const DraftWish& w : wishes) w.seq->drafts.clear();
      return s.WithContext("MTP drafting pass");
    }
    if (first_pass) {
      // Pass 1 wrote the entry of num_computed - 1 from the true pending token: it is final
      // (where the final run reaches it; the later passes write past num_computed).
      for (const Active& a : active) {
        Sequence& seq = *a.seq;
        if (seq.mtp_final >= seq.num_computed - 1) {
          seq.mtp_final = std::max(seq.mtp_final, seq.num_computed);
        }
      }
      first_pass = false;
    }
    std::vector<Active> next;
    std::vector<SequenceChunk> next_chunks;
    hidden_in_.clear();
    for (size_t i = 0; i < active.size(); ++i) {
      Sequence& seq = *active[i].seq;
      const std::span<const float> row(&logits_[i * static_cast<size_t>(vocab_size_)], vocab_size_);
      seq.drafts.push_back(PickDraftToken(seq, row));
      if (static_cast<int>(seq.drafts.size()) == active[i].want) continue;
      next_chunks.push_back({.tokens = std::span<const int32_t>(&seq.drafts.back(), 1),
                             .start = chunks[i].start + 1,
                             .pages = seq.table.pages(),
                             .want_logits = true});
      const float* h = &hidden_out_[i * static_cast<size_t>(hidden_size_)];
      hidden_in_.insert(hidden_in_.end(), h, h + hidden_size_);
      next.push_back(active[i]);
    }
    active.swap(next);
    chunks.swap(next_chunks);
  }
  return Status::Ok();
}

void MtpDrafter::Release(Sequence& seq) {
  seq.mtp_hidden.clear();
  seq.drafts.clear();
}

}  // namespace pdserve
