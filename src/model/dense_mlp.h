// DenseMlp: one layer's dense SwiGLU feed-forward as a LayerBlock: RMSNorm
// (post_attention_layernorm), the fused gate|up product, SiLU(gate)·up, and the down projection
// added to the residual stream. Under TP it holds this rank's gate and up columns
// `tp.intermediate` and down_proj's output columns `tp.hidden`. Not thread-safe: the forward
// thread runs it.
#pragma once

#include <cstddef>

#include "model/block.h"
#include "model/config.h"
#include "model/matrix.h"
#include "model/tp_slices.h"
#include "model/weights.h"

namespace pdserve {

class DenseMlp final : public LayerBlock {
 public:
  // Adds this rank's share of the MLP matrices of `w` to `packer` (they are taken from `w` when
  // it packs) and keeps `w`'s post-attention norm, which must outlive the block, as must
  // `config`.
  DenseMlp(const ModelConfig& config, const TpSlices& tp, LayerWeights& w, MatrixPacker& packer);

  Status Run(ForwardPass& pass) override;
  size_t WeightBytes() const override { return gate_up_.bytes() + down_.bytes(); }

 private:
  const ModelConfig& config_;
  const TpSlices tp_;
  const Tensor& post_norm_;
  Matrix gate_up_;  // [2 * intermediate, hidden]: gate and up fused, this rank's columns of each
  Matrix down_;     // [hidden, intermediate]: this rank's output columns
};

}  // namespace pdserve
