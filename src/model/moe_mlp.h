// MoeMlp: one layer's mixture-of-experts feed-forward (Qwen3-MoE, DeepSeek-V2/V3) as a
// LayerBlock: RMSNorm (post_attention_layernorm), the router, the chosen experts' SwiGLU
// products, their weighted sum and the shared experts' output added to the residual stream.
//
// Routing. The router's logits are an F32 product of the normed row (the weights widened at
// load), so a choice between two close experts does not hang on the BF16 rounding of the
// activations, and every TP rank, holding the same rows and the whole router, chooses the same
// experts bit for bit. Scores in double: softmax over the logits or their sigmoids. The
// experts_per_token best win (a tie goes to the lower expert id): by logit where that orders
// as the scores do, else by score plus noaux_tc's correction bias; with groups, only among the
// topk_group best groups. Their scores are the weights, renormalised to sum 1 when
// norm_topk_prob, times routed_scaling_factor (config.h, MoeConfig).
//
// Batching. The rows of a pass are grouped per expert (expert order, then row order), so each
// expert the pass hits is read once whatever the batch, and each group is one product. A row's
// output is sum_j weight_j * expert_j(row) in the router's order (j = 0 first), from zero, then
// plus the shared experts' output, so it does not depend on the other rows of the pass, on the
// chunking or on TP.
//
// Tensor parallelism: every rank holds its share `tp.expert_intermediate` of every expert's
// gate and up columns and `tp.hidden` of every expert's down_proj output columns (as DenseMlp
// splits its matrices), not whole experts: the ranks' work is then even whatever the router
// chooses, and one gather per product kind serves all the experts of a pass. Not thread-safe:
// the forward thread runs it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "model/block.h"
#include "model/config.h"
#include "model/dense_mlp.h"
#include "model/matrix.h"
#include "model/tp_slices.h"
#include "model/weights.h"

namespace pdserve {

class MoeMlp final : public LayerBlock {
 public:
  // Adds this rank's share of the router and of every expert's matrices in `w` to `packer` and
  // keeps `w`'s post-attention norm, which must outlive the block, as must `config`.
  MoeMlp(const ModelConfig& config, const TpSlices& tp, int layer, LayerWeights& w,
         MatrixPacker& packer);

  Status Run(ForwardPass& pass) override;
  // The router and every expert once: what a pass that hits every expert reads.
  size_t WeightBytes() const override;
  // The router and the experts this layer's rows chose in `trace`.
  size_t StepWeightBytes(const RoutingTrace& trace) const override;

 private:
  struct Expert {
    Matrix gate_up;  // [2 * expert_intermediate, hidden]: this rank's gate and up columns
    Matrix down;     // [hidden, expert_intermediate]: this rank's output columns
  };
  // Chooses each row's experts from the router's logits [rows][num_experts] into
  // choice_/weight_ ([rows][k]) and groups the rows per expert (group_begin_, slot_row_,
  // row_slot_).
  void Route(const float* logits, int rows);

  const ModelConfig& config_;
  const TpSlices tp_;
  const int layer_;
  const Tensor& post_norm_;
  Matrix router_;              // [num_experts, hidden] F32, whole on every rank
  const Tensor& router_bias_;  // noaux_tc's e_score_correction_bias, F32 (else empty)
  std::vector<Expert> experts_;
  std::unique_ptr<SwiGlu> shared_;  // DeepSeek's shared experts, if any

  // Routing of the current pass; sized for the largest pass seen.
  std::vector<int32_t> choice_;   // [rows][k]: expert ids, router's order
  std::vector<float> weight_;     // [rows][k]
  std::vector<int> group_begin_;  // [num_experts + 1]: each expert's first slot
  std::vector<int> slot_row_;     // [rows * k]: the row each slot computes
  std::vector<int> row_slot_;     // [rows][k]: the slot of each choice
};

}  // namespace pdserve
