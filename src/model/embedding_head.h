// EmbeddingHead: the two ends of the model at its vocabulary: each token's embedding row at the
// input, and the final RMSNorm and lm_head at the output. With tied embeddings the two share
// one matrix: the embedding rows are read from the packed lm_head (or, on one rank of several,
// from the embedding kept whole, since the rank's lm_head holds only its vocabulary columns
// `tp.vocab`) — unless the head is held in INT8 (ModelWeights::head_dtype): then the loader's
// INT8 copy is the head and the embedding stays whole for the row lookups. Not thread-safe: the
// forward thread uses it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "common/status.h"
#include "model/config.h"
#include "model/forward_pass.h"
#include "model/matrix.h"
#include "model/tp_slices.h"
#include "model/weights.h"

namespace pdserve {

class EmbeddingHead {
 public:
  // Adds this rank's share of the output matrix of `weights` (lm_head, or the tied embedding) to
  // `packer`, after every layer's matrices (the forward pass reads it last). `weights` and
  // `config` must outlive it.
  EmbeddingHead(const ModelConfig& config, const TpSlices& tp, ModelWeights& weights,
                MatrixPacker& packer);
  EmbeddingHead(const EmbeddingHead&) = delete;
  EmbeddingHead& operator=(const EmbeddingHead&) = delete;

  // The embedding of `token` as hidden_size floats.
  void Embed(int32_t token, float* out) const;
  // logits[i][vocab] = lm_head(final_norm(x[rows[i]])) for each row of the pass listed; with TP
  // every rank gets every column.
  Status Logits(ForwardPass& pass, std::span<const int> rows, float* logits) {
    return Logits(pass, rows, final_norm_, lm_head_, logits);
  }
  // The same through another norm and head of this rank's vocabulary columns (an MTP module's).
  Status Logits(ForwardPass& pass, std::span<const int> rows, const Tensor& norm,
                const Matrix& head, float* logits);
  const Matrix& lm_head() const { return lm_head_; }
  const Tensor& final_norm() const { return final_norm_; }
  size_t WeightBytes() const { return lm_head_.bytes(); }

 private:
  const ModelConfig& config_;
  const TpSlices tp_;
  const Tensor& embed_;  // empty once packed into lm_head_ (tied, one rank)
  const Tensor& final_norm_;
  Matrix lm_head_;  // [vocab, hidden]: this rank's vocabulary columns
};

}  // namespace pdserve
