// MlaAttention: one layer's multi-head latent attention (DeepSeek-V2/V3) as a LayerBlock, over a
// latent cache (KvKind::kLatent: per token c_kv, kv_lora_rank values normed by kv_a_layernorm,
// then k_pe, qk_rope_head_dim values with RoPE).
//
// The queries: q_a_proj -> q_a_layernorm -> q_b_proj (or q_proj), per head a no-RoPE part q_nope
// and a RoPE part q_pe. RoPE rotates pairs of adjacent dimensions (2i, 2i + 1) by frequency i:
// DeepSeek's convention (its Hugging Face port de-interleaves and then rotates halves, which
// gives the same dot products), not Llama's halves.
//
// Attention runs in the latent space for prefill and decode alike (the "absorbed" form of the
// DeepSeek-V2 paper): kv_b_proj's key part W_UK[h] is folded into the query, q_lat[h] =
// W_UK[h]^T q_nope[h], so a score is q_lat . c_kv + q_pe . k_pe and the weighted sum o_lat[h] =
// sum_s p_s c_kv[s] is expanded by the value part, out[h] = W_UV[h] o_lat[h]. A step reads the
// latent (576 values a token for V3) and never a decompressed K or V. One form for every pass
// keeps a token's bits the same prefilled in any chunking or decoded.
//
// Tensor parallelism: each rank holds its query heads (of q_b_proj, W_UK, W_UV) and o_proj's
// output columns `tp.hidden`, and the whole of q_a_proj and kv_a_proj_with_mqa: every rank
// computes and caches the whole latent (it is one head, replicated), so its cache needs nothing
// from another rank. Not thread-safe: the forward thread runs it.
#pragma once

#include <cstddef>
#include <vector>

#include "model/block.h"
#include "model/config.h"
#include "model/matrix.h"
#include "model/tp_slices.h"
#include "model/weights.h"

namespace pdserve {

class MlaAttention final : public LayerBlock {
 public:
  // Adds this rank's share of `w`'s attention matrices to `packer` and keeps `w`'s norms, which
  // must outlive the block, as must `config`.
  MlaAttention(const ModelConfig& config, const TpSlices& tp, int layer, LayerWeights& w,
               MatrixPacker& packer);

  Status Run(ForwardPass& pass) override;
  size_t WeightBytes() const override;

 private:
  // Each row's attention over its sequence's latent rows [0, pos]: q_lat and q_pe of this rank's
  // heads in, o_lat out ([rows][heads][kv_lora_rank]).
  void Attend(ForwardPass& pass, const float* q_lat, const float* q, float* o_lat) const;

  const ModelConfig& config_;
  const TpSlices tp_;
  const int layer_;
  const LayerWeights& w_;         // the norms
  Matrix q_a_;                    // [q_lora_rank, hidden] (q_lora_rank > 0)
  Matrix q_b_;                    // [heads * q_head_dim, q_lora_rank or hidden]: this rank's heads
  Matrix kv_a_;                   // [latent, hidden]
  std::vector<Tensor> uk_t_;      // per head W_UK[h]^T until packed
  std::vector<Matrix> absorb_q_;  // per head W_UK[h]^T: [kv_lora_rank, qk_nope_head_dim]
  std::vector<Matrix> absorb_o_;  // per head W_UV[h]: [v_head_dim, kv_lora_rank]
  Matrix o_proj_;                 // [hidden, heads * v_head_dim]: this rank's output columns
};

}  // namespace pdserve
