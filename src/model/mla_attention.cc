#include "model/mla_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/kernels.h"

namespace pdserve {
namespace {

// The workspace buffers of an MlaAttention pass.
enum Buffer : int {
  kNormed,   // [rows][hidden]; at the end the output projection
  kQa,       // [rows][q_lora_rank]
  kQ,        // [rows][heads][q_head_dim]
  kLatent,   // [rows][latent]: c_kv | k_pe of each row
  kQLat,     // [rows][heads][kv_lora_rank]; after attention, the heads' outputs [rows][...]
  kHeadIn,   // [rows][...]: one head's input to an absorbed product
  kHeadOut,  // [rows][...]: its output
  kOLat,     // [rows][heads][kv_lora_rank]
  // Attend's own, in buffers Run no longer needs by then (it asks for kNormed again after):
  kRunLatent = kNormed,  // [context][latent]: a run's latent rows as floats
  kRunQuery = kQa,       // [run rows][heads][latent]: q_lat | q_pe
  kRunScores = kLatent,  // [run rows][heads][context]
};

// RoPE over pairs of adjacent dimensions: (x[2i], x[2i+1]) turned by row angle i.
void RotateAdjacentPairs(float* x, int dim, const float* cos, const float* sin) {
  for (int i = 0; i < dim / 2; ++i) {
    const float a = x[2 * i], b = x[2 * i + 1];
    x[2 * i] = a * cos[i] - b * sin[i];
    x[2 * i + 1] = b * cos[i] + a * sin[i];
  }
}

// Copies column block [col, col + width) of data[rows][stride] into out[rows][width], or back.
void CopyColumns(const float* data, int rows, int stride, int col, int width, float* out) {
  for (int r = 0; r < rows; ++r) {
    std::memcpy(out + static_cast<size_t>(r) * width, data + static_cast<size_t>(r) * stride + col,
                width * sizeof(float));
  }
}
void PlaceColumns(const float* in, int rows, int stride, int col, int width, float* data) {
  for (int r = 0; r < rows; ++r) {
    std::memcpy(data + static_cast<size_t>(r) * stride + col, in + static_cast<size_t>(r) * width,
                width * sizeof(float));
  }
}

}  // namespace

MlaAttention::MlaAttention(const ModelConfig& config, const TpSlices& tp, int layer,
                           LayerWeights& w, MatrixPacker& packer)
    : config_(config), tp_(tp), layer_(layer), w_(w) {
  const MlaConfig& a = config.mla;
  const DimRange q_rows{tp.q_heads.begin * a.q_head_dim(), tp.q_heads.end * a.q_head_dim()};
  if (a.q_lora_rank > 0) {
    packer.Add({{&w.q_a_proj, {0, a.q_lora_rank}}}, &q_a_);
    packer.Add({{&w.q_b_proj, q_rows}}, &q_b_);
  } else {
    packer.Add({{&w.q_proj, q_rows}}, &q_b_);
  }
  packer.Add({{&w.kv_a_proj, {0, a.latent_dim()}}}, &kv_a_);
  // kv_b_proj per head: W_UK (qk_nope_head_dim rows), then W_UV (v_head_dim rows).
  const int heads = tp.q_heads.size();
  const int per_head = a.qk_nope_head_dim + a.v_head_dim;
  uk_t_.reserve(heads);  // the packer keeps pointers to them: no reallocation
  absorb_q_.resize(heads);
  absorb_o_.resize(heads);
  for (int h = 0; h < heads; ++h) {
    const int base = (tp.q_heads.begin + h) * per_head;
    uk_t_.push_back(TransposeRows(w.kv_b_proj, base, a.qk_nope_head_dim));
    packer.Add({{&uk_t_.back(), {0, a.kv_lora_rank}}}, &absorb_q_[h]);
    packer.Add({{&w.kv_b_proj,
                 {base + a.qk_nope_head_dim, base + per_head},
                 /*keep=*/h + 1 < heads}},
               &absorb_o_[h]);
  }
  packer.Add({{&w.o_proj, tp.hidden}}, &o_proj_);
}

size_t MlaAttention::WeightBytes() const {
  size_t bytes = q_a_.bytes() + q_b_.bytes() + kv_a_.bytes() + o_proj_.bytes();
  for (const Matrix& m : absorb_q_) bytes += m.bytes();
  for (const Matrix& m : absorb_o_) bytes += m.bytes();
  return bytes;
}

void MlaAttention::Attend(ForwardPass& pass, const float* q_lat, const float* q,
                          float* o_lat) const {
  const MlaConfig& a = config_.mla;
  const KvCache& cache = pass.cache;
  const int heads = tp_.q_heads.size();
  const int lora = a.kv_lora_rank, rope = a.qk_rope_head_dim, latent = a.latent_dim();
  const int qhd = a.q_head_dim();
  const int page_tokens = cache.layout().page_tokens;
  const bool bf16 = cache.layout().dtype == DType::kBF16;
  const float scale = static_cast<float>(config_.softmax_scale());
  const size_t row_bytes = static_cast<size_t>(latent) * cache.layout().elem_size();
  Workspace& ws = pass.workspace;
  // A run: consecutive rows of one sequence (a prefill chunk, or one decode row), positions
  // ascending. Its latent rows are read once, as floats, for all its rows and heads.
  for (int t0 = 0; t0 < pass.rows;) {
    const std::span<const PageId> pages = pass.chunk_of(t0).pages;
    int t1 = t0 + 1;
    while (t1 < pass.rows && pass.chunk_of(t1).pages.data() == pages.data()) ++t1;
    const int64_t ctx = pass.positions[t1 - 1] + 1;
    const int count = (t1 - t0) * heads;  // query rows of the run, [row][head]
    float* rows = ws.Floats(kRunLatent, static_cast<size_t>(ctx) * latent);
#pragma omp parallel for schedule(static) if (ctx * latent >= (1 << 16))
    for (int64_t s = 0; s < ctx; ++s) {
      const uint8_t* at = cache.Block(layer_, pages[s / page_tokens], KvComponent::kLatent) +
                          static_cast<size_t>(s % page_tokens) * row_bytes;
      float* c = rows + static_cast<size_t>(s) * latent;
      if (bf16) {
        const auto* v = reinterpret_cast<const uint16_t*>(at);
        for (int i = 0; i < latent; ++i) c[i] = BF16ToF32(v[i]);
      } else {
        std::memcpy(c, at, row_bytes);
      }
    }
    // Each query head as one latent-width row, q_lat | q_pe, so that a score is one product
    // over the latent row (F32 tiles: the same bits on every kernel path, and for every
    // context length the run pads to).
    float* query = ws.Floats(kRunQuery, static_cast<size_t>(count) * latent);
    for (int t = t0; t < t1; ++t) {
      for (int h = 0; h < heads; ++h) {
        float* row = query + (static_cast<size_t>(t - t0) * heads + h) * latent;
        std::memcpy(row, q_lat + (static_cast<size_t>(t) * heads + h) * lora, lora * sizeof(float));
        std::memcpy(row + lora, q + (static_cast<size_t>(t) * heads + h) * qhd + a.qk_nope_head_dim,
                    rope * sizeof(float));
      }
    }
    float* scores = ws.Floats(kRunScores, static_cast<size_t>(count) * ctx);
    kernels::MatMulF32(query, rows, scores, count, static_cast<int>(ctx), latent);
    // Each row and head: softmax over its own causal context, then the weighted sum of the
    // latent rows in position order.
#pragma omp parallel for schedule(static) if (static_cast <int64_t>(count) * ctx * lora >= \
                                              (1 << 16))
    for (int i = 0; i < count; ++i) {
      const int t = t0 + i / heads;
      const int64_t own = pass.positions[t] + 1;
      float* sc = scores + static_cast<size_t>(i) * ctx;
      for (int64_t s = 0; s < own; ++s) sc[s] *= scale;
      const float top = *std::max_element(sc, sc + own);
      float sum = 0.0f;
      for (int64_t s = 0; s < own; ++s) sum += sc[s] = std::exp(sc[s] - top);
      for (int64_t s = 0; s < own; ++s) sc[s] /= sum;
      float* o = o_lat + (static_cast<size_t>(t) * heads + i % heads) * lora;
      std::fill(o, o + lora, 0.0f);
      for (int64_t s = 0; s < own; ++s) {
        const float p = sc[s];
        const float* c = rows + static_cast<size_t>(s) * latent;
        for (int d = 0; d < lora; ++d) o[d] += p * c[d];
      }
    }
    t0 = t1;
  }
}

Status MlaAttention::Run(ForwardPass& pass) {
  const MlaConfig& a = config_.mla;
  KvCache& cache = pass.cache;
  const int rows = pass.rows;
  const int hidden = config_.hidden_size;
  const int heads = tp_.q_heads.size();
  const int lora = a.kv_lora_rank, nope = a.qk_nope_head_dim, rope = a.qk_rope_head_dim;
  const int qhd = a.q_head_dim(), latent = a.latent_dim(), vdim = a.v_head_dim;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  Workspace& ws = pass.workspace;

  float* h = ws.Floats(kNormed, static_cast<size_t>(rows) * hidden);
  kernels::RmsNorm(pass.x, w_.input_norm.as<float>(), h, rows, hidden, eps);
  float* q = ws.Floats(kQ, static_cast<size_t>(rows) * heads * qhd);
  if (a.q_lora_rank > 0) {
    float* qa = ws.Floats(kQa, static_cast<size_t>(rows) * a.q_lora_rank);
    pass.linear.Linear(h, rows, q_a_, qa);
    kernels::RmsNorm(qa, w_.q_a_norm.as<float>(), qa, rows, a.q_lora_rank, eps);
    pass.linear.Linear(qa, rows, q_b_, q);
  } else {
    pass.linear.Linear(h, rows, q_b_, q);
  }
  float* kv = ws.Floats(kLatent, static_cast<size_t>(rows) * latent);
  pass.linear.Linear(h, rows, kv_a_, kv);

  // Each row: its latent normed, RoPE on k_pe and every head's q_pe, the latent into its page.
  const KvLayout& layout = cache.layout();
  for (int t = 0; t < rows; ++t) {
    float* c = kv + static_cast<size_t>(t) * latent;
    kernels::RmsNorm(c, w_.kv_a_norm.as<float>(), c, 1, lora, eps);
    const float* cos = pass.rope.cos(t);
    const float* sin = pass.rope.sin(t);
    RotateAdjacentPairs(c + lora, rope, cos, sin);
    for (int hd = 0; hd < heads; ++hd) {
      RotateAdjacentPairs(q + (static_cast<size_t>(t) * heads + hd) * qhd + nope, rope, cos, sin);
    }
    const int64_t pos = pass.positions[t];
    uint8_t* at = cache.Block(layer_, pass.chunk_of(t).pages[pos / layout.page_tokens],
                              KvComponent::kLatent) +
                  static_cast<size_t>(pos % layout.page_tokens) * latent * layout.elem_size();
    if (layout.dtype == DType::kBF16) {
      kernels::ToBF16(c, reinterpret_cast<uint16_t*>(at), latent);
    } else {
      std::memcpy(at, c, static_cast<size_t>(latent) * sizeof(float));
    }
  }

  // q_lat[h] = W_UK[h]^T q_nope[h]: every head's rows, head-major, in one grouped product.
  float* q_lat = ws.Floats(kQLat, static_cast<size_t>(rows) * heads * lora);
  float* head_in = ws.Floats(kHeadIn, static_cast<size_t>(heads) * rows * std::max(nope, lora));
  float* head_out = ws.Floats(kHeadOut, static_cast<size_t>(heads) * rows * std::max(lora, vdim));
  std::vector<TpLinear::RowGroup> per_head(heads);
  for (int hd = 0; hd < heads; ++hd) {
    CopyColumns(q, rows, heads * qhd, hd * qhd, nope,
                head_in + static_cast<size_t>(hd) * rows * nope);
    per_head[hd] = {hd * rows, rows, &absorb_q_[hd]};
  }
  pass.linear.GroupedLinear(head_in, per_head, head_out);
  for (int hd = 0; hd < heads; ++hd) {
    PlaceColumns(head_out + static_cast<size_t>(hd) * rows * lora, rows, heads * lora, hd * lora,
                 lora, q_lat);
  }
  float* o_lat = ws.Floats(kOLat, static_cast<size_t>(rows) * heads * lora);
  Attend(pass, q_lat, q, o_lat);

  // out[h] = W_UV[h] o_lat[h] into this rank's columns of every head's output, gathered; the
  // heads again in one grouped product.
  const int attn_width = config_.num_heads * vdim;
  float* attn = ws.Floats(kQLat, static_cast<size_t>(rows) * attn_width);
  head_in = ws.Floats(kHeadIn, static_cast<size_t>(heads) * rows * std::max(nope, lora));
  head_out = ws.Floats(kHeadOut, static_cast<size_t>(heads) * rows * std::max(lora, vdim));
  for (int hd = 0; hd < heads; ++hd) {
    CopyColumns(o_lat, rows, heads * lora, hd * lora, lora,
                head_in + static_cast<size_t>(hd) * rows * lora);
    per_head[hd].w = &absorb_o_[hd];
  }
  pass.linear.GroupedLinear(head_in, per_head, head_out);
  for (int hd = 0; hd < heads; ++hd) {
    PlaceColumns(head_out + static_cast<size_t>(hd) * rows * vdim, rows, attn_width,
                 (tp_.q_heads.begin + hd) * vdim, vdim, attn);
  }
  PD_RETURN_IF_ERROR(pass.linear.GatherColumns(attn, rows, attn_width,
                                               {tp_.q_heads.begin * vdim, tp_.q_heads.end * vdim}));
  float* out = ws.Floats(kNormed, static_cast<size_t>(rows) * hidden);
  PD_RETURN_IF_ERROR(
      pass.linear.ColumnParallelLinear(attn, rows, o_proj_, tp_.hidden, hidden, out));
  pass.AddToResidual(out);
  return Status::Ok();
}

}  // namespace pdserve
