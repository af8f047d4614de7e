// GqaAttention: one layer's grouped-query attention (Llama, Qwen2/2.5, Qwen3, Mistral) as a
// LayerBlock: RMSNorm, the fused q|k|v product (with Qwen2's bias), Qwen3's RMSNorm over each head
// of q and k, RoPE, each row's K and V stored into its sequence's pages (kernels::StoreKv), paged
// attention over them, and the output projection added to the residual stream. Under TP it
// holds this rank's query and KV heads (its cache holds only those KV heads) and o_proj's
// output columns `tp.hidden`. Not thread-safe: the forward thread runs it.
#pragma once

#include <cstddef>

#include "model/block.h"
#include "model/config.h"
#include "model/matrix.h"
#include "model/tp_slices.h"
#include "model/weights.h"

namespace pdserve {

class GqaAttention final : public LayerBlock {
 public:
  // Layer `layer` of the model: adds this rank's share of the attention matrices of `w` to
  // `packer` (they are taken from `w` when it packs) and keeps `w`'s norms, which must outlive
  // the block, as must `config`.
  GqaAttention(const ModelConfig& config, const TpSlices& tp, int layer, LayerWeights& w,
               MatrixPacker& packer);

  Status Run(ForwardPass& pass) override;
  size_t WeightBytes() const override { return qkv_.bytes() + o_proj_.bytes(); }

 private:
  const ModelConfig& config_;
  const TpSlices tp_;
  const int layer_;
  const LayerWeights& w_;  // input_norm, q_norm and k_norm
  // Projections that read the same input are fused into one matrix, so one pass over the
  // activations feeds them all.
  Matrix qkv_;       // [(heads + 2 * kv_heads) * head_dim, hidden]: this rank's heads
  Tensor qkv_bias_;  // F32, empty without bias
  Matrix o_proj_;    // [hidden, heads * head_dim]: this rank's output columns
};

}  // namespace pdserve
