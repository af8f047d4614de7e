#include "model/gqa_attention.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/kernels.h"

namespace pdserve {
namespace {

// The workspace buffers of a GqaAttention pass.
enum Buffer : int { kNormed, kQkv, kAttention, kOutput };

}  // namespace

GqaAttention::GqaAttention(const ModelConfig& config, const TpSlices& tp, int layer,
                           LayerWeights& w, MatrixPacker& packer)
    : config_(config), tp_(tp), layer_(layer), w_(w) {
  const int hd = config.head_dim;
  const DimRange q_rows{tp.q_heads.begin * hd, tp.q_heads.end * hd};
  const DimRange kv_rows{tp.kv_heads.begin * hd, tp.kv_heads.end * hd};
  packer.Add({{&w.q_proj, q_rows}, {&w.k_proj, kv_rows}, {&w.v_proj, kv_rows}}, &qkv_);
  packer.Add({{&w.o_proj, tp.hidden}}, &o_proj_);
  if (!w.q_bias.empty()) {
    qkv_bias_ = TakeRows({{&w.q_bias, q_rows}, {&w.k_bias, kv_rows}, {&w.v_bias, kv_rows}});
  }
}

Status GqaAttention::Run(ForwardPass& pass) {
  KvCache& cache = pass.cache;
  const int total = pass.rows;
  const int hidden = config_.hidden_size;
  const int hd = config_.head_dim;
  // This rank's heads (all of them without TP): q | k | v of its heads per token row.
  const int q_heads = tp_.q_heads.size();
  const int kv_heads = tp_.kv_heads.size();
  const int q_width = q_heads * hd;
  const int kv_width = kv_heads * hd;
  const int qkv_width = q_width + 2 * kv_width;
  const int attn_width = config_.num_heads * hd;  // the attention output of every head
  const float eps = static_cast<float>(config_.rms_norm_eps);
  Workspace& ws = pass.workspace;

  float* h = ws.Floats(kNormed, static_cast<size_t>(total) * hidden);
  kernels::RmsNorm(pass.x, w_.input_norm.as<float>(), h, total, hidden, eps);
  float* qkv = ws.Floats(kQkv, static_cast<size_t>(total) * qkv_width);
  pass.linear.Linear(h, total, qkv_, qkv);

#pragma omp parallel for schedule(static) if (static_cast <int64_t>(total) * qkv_width >= 65536)
  for (int t = 0; t < total; ++t) {
    float* q = &qkv[static_cast<size_t>(t) * qkv_width];
    float* k = q + q_width;
    float* v = k + kv_width;
    if (!qkv_bias_.empty()) {
      const float* b = qkv_bias_.as<float>();
      for (int i = 0; i < qkv_width; ++i) q[i] += b[i];
    }
    if (config_.qk_norm) {
      kernels::RmsNorm(q, w_.q_norm.as<float>(), q, q_heads, hd, eps);
      kernels::RmsNorm(k, w_.k_norm.as<float>(), k, kv_heads, hd, eps);
    }
    const float* c = pass.rope.cos(t);
    const float* s = pass.rope.sin(t);
    kernels::ApplyRope(q, q_heads, hd, c, s);
    kernels::ApplyRope(k, kv_heads, hd, c, s);
    const int64_t pos = pass.positions[t];
    kernels::StoreKv(cache, layer_, pass.chunk_of(t).pages[pos / cache.layout().page_tokens],
                     static_cast<int>(pos % cache.layout().page_tokens), k, v);
  }

  // Each rank writes its heads' outputs into their columns of the whole attention output.
  float* attn = ws.Floats(kAttention, static_cast<size_t>(total) * attn_width);
  std::vector<kernels::AttentionQuery> queries(total);
  for (int t = 0; t < total; ++t) {
    queries[t] = {.q = &qkv[static_cast<size_t>(t) * qkv_width],
                  .out = &attn[static_cast<size_t>(t) * attn_width + tp_.q_heads.begin * hd],
                  .pages = pass.chunk_of(t).pages.data(),
                  .context_len = pass.positions[t] + 1};
  }
  kernels::PagedAttention(queries, cache, layer_, q_heads,
                          1.0f / std::sqrt(static_cast<float>(hd)));
  PD_RETURN_IF_ERROR(pass.linear.GatherColumns(attn, total, attn_width,
                                               {tp_.q_heads.begin * hd, tp_.q_heads.end * hd}));

  float* out = ws.Floats(kOutput, static_cast<size_t>(total) * hidden);
  PD_RETURN_IF_ERROR(
      pass.linear.ColumnParallelLinear(attn, total, o_proj_, tp_.hidden, hidden, out));
  pass.AddToResidual(out);
  return Status::Ok();
}

}  // namespace pdserve
