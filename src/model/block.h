// LayerBlock: one sub-layer of a decoder layer as the layer loop calls it (Transformer::Forward):
// an attention block, then a feed-forward block, per layer. Each kind is a class of its own
// (GqaAttention, DenseMlp), chosen per layer from the config when the model is built
// (Transformer::MakeLayer); a new kind — MLA attention over a latent cache, an MoE feed-forward
// — is a new class next to them, not a branch inside them.
//
// A block owns its layer's weights in kernel form (its matrices packed by the model's
// MatrixPacker) and runs its whole sub-layer on every row of a pass: the norm of its input, its
// products and their tensor-parallel gathers, and the add to the residual stream. One virtual
// call per block per pass; the per-token loops are inside. Not thread-safe: the forward thread
// runs the blocks (the kernels use OpenMP inside).
#pragma once

#include <cstddef>

#include "common/status.h"
#include "model/forward_pass.h"

namespace pdserve {

class LayerBlock {
 public:
  virtual ~LayerBlock() = default;
  // x += block(norm(x)) for every row of the pass (an attention block also writes each row's KV
  // into its sequence's pages first). With TP every rank runs the same blocks on the same rows,
  // so the gathers meet; a failed group fails the block.
  virtual Status Run(ForwardPass& pass) = 0;
  // Bytes of weights one pass reads (each matrix once).
  virtual size_t WeightBytes() const = 0;
  // Bytes of weights the pass that left `trace` read: all of them but for an MoE block, which
  // reads only the experts its rows chose.
  virtual size_t StepWeightBytes(const RoutingTrace& /*trace*/) const { return WeightBytes(); }
};

}  // namespace pdserve
