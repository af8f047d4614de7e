// SwiGlu: the products of one SwiGLU feed-forward, down(SiLU(gate x) * up x), on rows already
// normed; DenseMlp: a layer's dense feed-forward as a LayerBlock (RMSNorm
// post_attention_layernorm, SwiGlu, the add to the residual stream). Under TP a SwiGlu holds
// this rank's gate and up columns `inter` and down_proj's output columns `tp.hidden`, and
// gathers the others'. Not thread-safe: the forward thread runs them.
#pragma once

#include <cstddef>

#include "model/block.h"
#include "model/config.h"
#include "model/matrix.h"
#include "model/tp_slices.h"
#include "model/weights.h"

namespace pdserve {

class SwiGlu {
 public:
  // Adds this rank's share of gate, up (columns `inter` of `width`) and down (output columns
  // `hidden`) to `packer`; the tensors are taken from when it packs.
  SwiGlu(Tensor& gate, Tensor& up, Tensor& down, int width, DimRange inter, DimRange hidden,
         MatrixPacker& packer);
  // out[rows][hidden_size] = the MLP of h[rows][hidden_size]. Uses workspace buffers `scratch`
  // and `scratch + 1`.
  Status Apply(ForwardPass& pass, const float* h, int rows, float* out, int scratch) const;
  size_t WeightBytes() const { return gate_up_.bytes() + down_.bytes(); }

 private:
  int width_;
  DimRange inter_, hidden_;
  Matrix gate_up_;  // [2 * inter, hidden]: gate and up fused, this rank's columns of each
  Matrix down_;     // [hidden, width]: this rank's output columns
};

class DenseMlp final : public LayerBlock {
 public:
  // Adds this rank's share of the MLP matrices of `w` to `packer` (they are taken from `w` when
  // it packs) and keeps `w`'s post-attention norm, which must outlive the block, as must
  // `config`.
  DenseMlp(const ModelConfig& config, const TpSlices& tp, LayerWeights& w, MatrixPacker& packer);

  Status Run(ForwardPass& pass) override;
  size_t WeightBytes() const override { return mlp_.WeightBytes(); }

 private:
  const ModelConfig& config_;
  const Tensor& post_norm_;
  SwiGlu mlp_;
};

}  // namespace pdserve
