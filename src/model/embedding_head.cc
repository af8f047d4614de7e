#include "model/embedding_head.h"

#include <algorithm>
#include <cstring>

#include "kernels/kernels.h"

namespace pdserve {

EmbeddingHead::EmbeddingHead(const ModelConfig& config, const TpSlices& tp, ModelWeights& weights,
                             MatrixPacker& packer)
    : config_(config), tp_(tp), embed_(weights.embed), final_norm_(weights.final_norm) {
  // A tied embedding lives on only inside the output matrix (Embed reads it from there) —
  // unless this is one TP rank, whose output matrix holds only its slice of the vocabulary.
  // An 8-bit head of a tied model is a copy (weights.lm_head): the embedding stays as it is.
  const bool tied = weights.lm_head.empty();
  Tensor& output = tied ? weights.embed : weights.lm_head;
  const bool keep_embed = tied && tp.size > 1;
  packer.Add({{&output, tp.vocab, keep_embed}}, &lm_head_);
}

void EmbeddingHead::Embed(int32_t token, float* out) const {
  const int hidden = config_.hidden_size;
  if (!embed_.empty()) {
    const size_t offset = static_cast<size_t>(token) * hidden * DTypeSize(embed_.dtype());
    ConvertToF32(embed_.dtype(), static_cast<const uint8_t*>(embed_.data()) + offset, out, hidden);
  } else if (lm_head_.bf16 == nullptr) {
    const float* row = lm_head_.f32.as<float>() + static_cast<size_t>(token) * hidden;
    std::copy(row, row + hidden, out);
  } else {
    kernels::UnpackRowBF16(lm_head_.bf16, lm_head_.n, lm_head_.k, token, out);
  }
}

Status EmbeddingHead::Logits(ForwardPass& pass, std::span<const int> rows, const Tensor& norm,
                             const Matrix& head, float* logits) {
  const int hidden = config_.hidden_size;
  const int m = static_cast<int>(rows.size());
  float* h = pass.workspace.Floats(0, static_cast<size_t>(m) * hidden);
  for (int i = 0; i < m; ++i) {
    std::memcpy(&h[static_cast<size_t>(i) * hidden], &pass.x[static_cast<size_t>(rows[i]) * hidden],
                hidden * sizeof(float));
  }
  kernels::RmsNorm(h, norm.as<float>(), h, m, hidden, static_cast<float>(config_.rms_norm_eps));
  if (m == 0) return Status::Ok();
  return pass.linear.ColumnParallelLinear(h, m, head, tp_.vocab, config_.vocab_size, logits);
}

}  // namespace pdserve
