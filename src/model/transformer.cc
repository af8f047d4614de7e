#include "model/transformer.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "kernels/dispatch.h"
#include "kernels/kernels.h"
#include "kv/shard_layout.h"

namespace pdserve {

// Per layer, the matrices in kernel form. Projections that read the same input are fused into
// one matrix so one pass over the activations feeds them all: q|k|v and gate|up.
struct Transformer::LayerMatrices {
  Matrix qkv;       // [(heads + 2 * kv_heads) * head_dim, hidden]
  Tensor qkv_bias;  // F32, empty without bias
  Matrix o_proj;    // [hidden, heads * head_dim]
  Matrix gate_up;   // [2 * intermediate, hidden]
  Matrix down;      // [hidden, intermediate]
};

namespace {

// Rows [rows.begin, rows.end) of a tensor (its first dimension), to be joined with others.
struct RowSlice {
  Tensor* tensor;
  DimRange rows;
  bool keep = false;  // the tensor lives on after (a tied embedding sliced for a TP rank)
};

// The given rows of tensors of equal column count (and dtype), concatenated; the tensors are
// released unless kept. A single whole tensor is moved, not copied.
Tensor TakeRows(std::initializer_list<RowSlice> parts) {
  const RowSlice& first = *parts.begin();
  if (parts.size() == 1 && !first.keep && first.rows.begin == 0 &&
      first.rows.end == first.tensor->dim(0)) {
    return std::exchange(*first.tensor, Tensor());
  }
  std::vector<int64_t> shape = first.tensor->shape();
  shape[0] = 0;
  for (const RowSlice& p : parts) shape[0] += p.rows.size();
  Tensor out(first.tensor->dtype(), shape);
  auto* dst = static_cast<uint8_t*>(out.data());
  for (const RowSlice& p : parts) {
    const size_t row_bytes = p.tensor->nbytes() / static_cast<size_t>(p.tensor->dim(0));
    std::memcpy(dst, static_cast<const uint8_t*>(p.tensor->data()) + p.rows.begin * row_bytes,
                p.rows.size() * row_bytes);
    dst += p.rows.size() * row_bytes;
  }
  for (const RowSlice& p : parts) {
    if (!p.keep) *p.tensor = Tensor();
  }
  return out;
}

// Rank `rank`'s contiguous share of `n` output columns, in whole 64-column blocks of the
// packed BF16 layout (the last ranks' shares may be shorter, or empty for a small n).
DimRange ColumnShare(int n, int rank, int size) {
  constexpr int kBlock = 64;
  const int per_rank = (n + size - 1) / size;
  const int share = (per_rank + kBlock - 1) / kBlock * kBlock;
  const int begin = std::min(n, rank * share);
  return {begin, std::min(n, begin + share)};
}

}  // namespace

Result<TpSlices> TpSlices::Create(const ModelConfig& config, int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size) {
    return Status::InvalidArgument(fmt::format("tensor-parallel rank {} of {}", rank, size));
  }
  PD_ASSIGN_OR_RETURN(KvShardLayout shards,
                      KvShardLayout::ForTensorParallel(config.num_kv_heads, size));
  TpSlices t;
  t.rank = rank;
  t.size = size;
  const HeadRange kv = shards.heads(rank);
  t.kv_heads = {kv.begin, kv.end};
  // Query heads: those of this rank's KV heads; the replicas of a KV head split them.
  const int group = config.num_heads / config.num_kv_heads;
  const int replicas = static_cast<int>(shards.group_ranks(shards.group_of(rank)).size());
  if (group % replicas != 0) {
    return Status::InvalidArgument(fmt::format(
        "TP {}: the {} query heads of a KV head cannot be split between its {} replica ranks", size,
        group, replicas));
  }
  const int per_replica = group / replicas;
  t.q_heads.begin = kv.begin * group + shards.replica_index(rank) * per_replica;
  t.q_heads.end = t.q_heads.begin + kv.size() * group / replicas;
  t.hidden = ColumnShare(config.hidden_size, rank, size);
  t.intermediate = ColumnShare(config.intermediate_size, rank, size);
  t.vocab = ColumnShare(config.vocab_size, rank, size);
  return t;
}

std::vector<double> RopeInverseFrequencies(const ModelConfig& config) {
  const int half = config.head_dim / 2;
  std::vector<double> inv(half);
  for (int i = 0; i < half; ++i) {
    inv[i] = std::pow(config.rope_theta, -2.0 * i / config.head_dim);
  }
  const RopeScaling& rs = config.rope_scaling;
  if (rs.type == RopeScaling::Type::kLinear) {
    for (double& f : inv) f /= rs.factor;
  } else if (rs.type == RopeScaling::Type::kLlama3) {
    const double old_ctx = rs.original_max_position_embeddings;
    const double low_freq_wavelen = old_ctx / rs.low_freq_factor;
    const double high_freq_wavelen = old_ctx / rs.high_freq_factor;
    for (double& f : inv) {
      const double wavelen = 2 * std::numbers::pi / f;
      if (wavelen < high_freq_wavelen) continue;
      if (wavelen > low_freq_wavelen) {
        f /= rs.factor;
      } else {
        const double smooth =
            (old_ctx / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
        f = (1 - smooth) * f / rs.factor + smooth * f;
      }
    }
  }
  return inv;
}

Result<std::unique_ptr<Transformer>> Transformer::Create(ModelConfig config, ModelWeights weights,
                                                         const TransformerOptions& options) {
  if (config.head_dim % 2 != 0 || config.head_dim > 256) {
    return Status::InvalidArgument(
        fmt::format("head_dim {} unsupported (must be even and <= 256)", config.head_dim));
  }
  if (static_cast<int>(weights.layers.size()) != config.num_layers) {
    return Status::InvalidArgument("weights do not match the config's layer count");
  }
  if (options.threads < 0) return Status::InvalidArgument("threads must be >= 0");
  const DType kv =
      options.kv_dtype.value_or(weights.matrix_dtype == DType::kF32 ? DType::kF32 : DType::kBF16);
  PD_RETURN_IF_ERROR(CheckKvCacheDType(kv));
  PD_ASSIGN_OR_RETURN(TpSlices tp, TpSlices::Create(config, options.tp_rank, options.tp_size));
  return std::unique_ptr<Transformer>(
      new Transformer(std::move(config), std::move(weights), kv, options.threads, tp));
}

namespace {

// Packed BF16 values of a matrix in the arena, rounded up to a whole cache line.
size_t ArenaElements(int64_t n, int64_t k) {
  constexpr size_t kLineElements = 64 / sizeof(uint16_t);
  const size_t elems = kernels::PackedBF16Elements(static_cast<int>(n), static_cast<int>(k));
  return (elems + kLineElements - 1) / kLineElements * kLineElements;
}

}  // namespace

Transformer::Matrix Transformer::ToMatrix(Tensor w, uint16_t** cursor) {
  Matrix m;
  m.n = static_cast<int>(w.dim(0));
  m.k = static_cast<int>(w.dim(1));
  if (w.dtype() == DType::kF32) {
    m.f32 = std::move(w);
    return m;
  }
  m.bf16 = *cursor;
  kernels::PackBF16(w.as<uint16_t>(), m.n, m.k, *cursor);
  *cursor += ArenaElements(m.n, m.k);
  return m;  // the unpacked original is freed here
}

size_t Transformer::MatrixBytes(const Matrix& m) {
  return m.bf16 == nullptr ? m.f32.nbytes()
                           : kernels::PackedBF16Elements(m.n, m.k) * sizeof(uint16_t);
}

Transformer::Transformer(ModelConfig config, ModelWeights weights, DType kv_dtype, int threads,
                         TpSlices tp)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      kv_dtype_(kv_dtype),
      kernel_path_(kernels::ActivePath()),
      threads_(threads),
      tp_(tp) {
  inv_freq_ = RopeInverseFrequencies(config_);
  layers_.resize(weights_.layers.size());
  // A tied embedding lives on only inside the output matrix (EmbedRow reads it from there) —
  // unless this is one TP rank, whose output matrix holds only its slice of the vocabulary.
  const bool tied = weights_.lm_head.empty();
  Tensor& output = tied ? weights_.embed : weights_.lm_head;
  const bool keep_embed = tied && tp_.size > 1;
  const int hd = config_.head_dim;
  const DimRange q_rows{tp_.q_heads.begin * hd, tp_.q_heads.end * hd};
  const DimRange kv_rows{tp_.kv_heads.begin * hd, tp_.kv_heads.end * hd};
  // Every weight matrix: the rows of the tensors it joins (this rank's share), and where it
  // goes. Walked once to size the arena and once to pack into it, so the walks cannot disagree.
  auto for_each_matrix = [&](auto&& fn) {
    for (size_t i = 0; i < layers_.size(); ++i) {
      LayerWeights& w = weights_.layers[i];
      LayerMatrices& f = layers_[i];
      fn({{&w.q_proj, q_rows}, {&w.k_proj, kv_rows}, {&w.v_proj, kv_rows}}, f.qkv);
      fn({{&w.o_proj, tp_.hidden}}, f.o_proj);
      fn({{&w.gate_proj, tp_.intermediate}, {&w.up_proj, tp_.intermediate}}, f.gate_up);
      fn({{&w.down_proj, tp_.hidden}}, f.down);
    }
    fn({{&output, tp_.vocab, keep_embed}}, lm_head_);
  };
  // The arena's pages are touched only as each matrix is packed into it, while the unpacked
  // originals are freed one by one, so loading still holds about one copy of the weights.
  size_t arena = 0;
  for_each_matrix([&arena](std::initializer_list<RowSlice> parts, Matrix&) {
    const Tensor& first = *parts.begin()->tensor;
    if (first.dtype() == DType::kF32) return;
    int64_t rows = 0;
    for (const RowSlice& p : parts) rows += p.rows.size();
    arena += ArenaElements(rows, first.dim(1));
  });
  constexpr size_t kPageElements = (size_t{2} << 20) / sizeof(uint16_t);
  if (arena > 0) {
    arena = (arena + kPageElements - 1) / kPageElements * kPageElements;
    packed_arena_ = Tensor::Uninitialized(DType::kBF16, {static_cast<int64_t>(arena)});
  }
  uint16_t* cursor = packed_arena_.empty() ? nullptr : packed_arena_.as<uint16_t>();
  for_each_matrix([&cursor](std::initializer_list<RowSlice> parts, Matrix& m) {
    m = ToMatrix(TakeRows(parts), &cursor);
  });
  for (size_t i = 0; i < layers_.size(); ++i) {
    LayerWeights& w = weights_.layers[i];
    if (!w.q_bias.empty()) {
      layers_[i].qkv_bias =
          TakeRows({{&w.q_bias, q_rows}, {&w.k_bias, kv_rows}, {&w.v_bias, kv_rows}});
    }
  }
}

Transformer::~Transformer() = default;

KvLayout Transformer::MakeKvLayout(int num_pages, int page_tokens) const {
  return KvLayout{.num_layers = config_.num_layers,
                  .num_kv_heads = tp_.kv_heads.size(),
                  .head_dim = config_.head_dim,
                  .page_tokens = page_tokens,
                  .dtype = kv_dtype_,
                  .num_pages = num_pages};
}

size_t Transformer::WeightBytes() const {
  size_t bytes = MatrixBytes(lm_head_);
  for (const LayerMatrices& f : layers_) {
    bytes +=
        MatrixBytes(f.qkv) + MatrixBytes(f.o_proj) + MatrixBytes(f.gate_up) + MatrixBytes(f.down);
  }
  return bytes;
}

void Transformer::Linear(const float* x, int m, const Matrix& w, float* y) {
  if (w.bf16 == nullptr) {
    kernels::MatMulF32(x, w.f32.as<float>(), y, m, w.n, w.k);
    return;
  }
  const size_t count = static_cast<size_t>(m) * w.k;
  if (x_bf16_.size() < count) x_bf16_.resize(count);
  kernels::ToBF16(x, x_bf16_.data(), count);
  kernels::MatMulBF16(x_bf16_.data(), w.bf16, y, m, w.n, w.k);
}

void Transformer::EmbedRow(int32_t token, float* out) const {
  const int hidden = config_.hidden_size;
  if (!weights_.embed.empty()) {
    const Tensor& e = weights_.embed;
    const size_t offset = static_cast<size_t>(token) * hidden * DTypeSize(e.dtype());
    ConvertToF32(e.dtype(), static_cast<const uint8_t*>(e.data()) + offset, out, hidden);
  } else if (lm_head_.bf16 == nullptr) {
    const float* row = lm_head_.f32.as<float>() + static_cast<size_t>(token) * hidden;
    std::copy(row, row + hidden, out);
  } else {
    kernels::UnpackRowBF16(lm_head_.bf16, lm_head_.n, lm_head_.k, token, out);
  }
}

uint64_t Transformer::Fingerprint() const {
  // FNV-1a, continued from the config's hash over "kernels=<path>".
  uint64_t h = config_.Fingerprint();
  for (char ch : std::string("kernels=") + std::string(kernel_path_)) {
    h ^= static_cast<unsigned char>(ch);
    h *= 0x100000001b3ull;
  }
  return h;
}

Status Transformer::Validate(std::span<const SequenceChunk> chunks, const KvCache& cache) const {
  if (kernels::ActivePath() != kernel_path_) {
    return Status::FailedPrecondition(fmt::format(
        "kernel path changed from {} to {} since the model was loaded (its fingerprint and KV "
        "cache belong to {})",
        kernel_path_, kernels::ActivePath(), kernel_path_));
  }
  const KvLayout& l = cache.layout();
  if (tp_.size > 1 &&
      (group_ == nullptr || group_->size() != tp_.size || group_->rank() != tp_.rank)) {
    return Status::FailedPrecondition(
        fmt::format("tensor-parallel rank {} of {} has no matching group", tp_.rank, tp_.size));
  }
  if (l.num_layers != config_.num_layers || l.num_kv_heads != tp_.kv_heads.size() ||
      l.head_dim != config_.head_dim || l.dtype != kv_dtype_) {
    return Status::InvalidArgument("KV cache layout does not match the model: " + l.ToString());
  }
  for (const SequenceChunk& c : chunks) {
    if (c.tokens.empty()) return Status::InvalidArgument("empty chunk");
    const int64_t end = c.start + static_cast<int64_t>(c.tokens.size());
    if (c.start < 0 || end > config_.MaxContext()) {
      return Status::OutOfRange(fmt::format("positions [{}, {}) exceed the model context {}",
                                            c.start, end, config_.MaxContext()));
    }
    if (static_cast<int64_t>(c.pages.size()) * l.page_tokens < end) {
      return Status::InvalidArgument(
          fmt::format("{} pages do not cover {} tokens", c.pages.size(), end));
    }
    for (PageId p : c.pages) {
      if (p < 0 || p >= l.num_pages) return Status::InvalidArgument("page id out of range");
    }
    for (int32_t t : c.tokens) {
      if (t < 0 || t >= config_.vocab_size) {
        return Status::InvalidArgument(
            fmt::format("token id {} out of range [0, {})", t, config_.vocab_size));
      }
    }
  }
  return Status::Ok();
}

Status Transformer::Forward(std::span<const SequenceChunk> chunks, KvCache& cache,
                            std::vector<float>* logits, LayerObserver* observer) {
  PD_RETURN_IF_ERROR(Validate(chunks, cache));
  // The team size is an OpenMP setting of the calling thread (and the oneDNN calls inherit it),
  // so it is applied here, on the thread that runs the pass (the engine's loop thread), not once
  // in Create on whichever thread built the model.
  if (threads_ > 0 && omp_get_max_threads() != threads_) omp_set_num_threads(threads_);
  const int hidden = config_.hidden_size;
  const int half = config_.head_dim / 2;
  int total = 0;
  for (const SequenceChunk& c : chunks) total += static_cast<int>(c.tokens.size());

  // Token rows: embeddings, positions and the RoPE angles of each position.
  x_.resize(static_cast<size_t>(total) * hidden);
  positions_.resize(total);
  token_chunk_.resize(total);
  cos_.resize(static_cast<size_t>(total) * half);
  sin_.resize(static_cast<size_t>(total) * half);
  int row = 0;
  for (int ci = 0; ci < static_cast<int>(chunks.size()); ++ci) {
    const SequenceChunk& c = chunks[ci];
    for (size_t i = 0; i < c.tokens.size(); ++i, ++row) {
      positions_[row] = c.start + static_cast<int64_t>(i);
      token_chunk_[row] = ci;
      EmbedRow(c.tokens[i], &x_[static_cast<size_t>(row) * hidden]);
      for (int j = 0; j < half; ++j) {
        const double angle = static_cast<double>(positions_[row]) * inv_freq_[j];
        cos_[static_cast<size_t>(row) * half + j] = static_cast<float>(std::cos(angle));
        sin_[static_cast<size_t>(row) * half + j] = static_cast<float>(std::sin(angle));
      }
    }
  }

  for (int layer = 0; layer < config_.num_layers; ++layer) {
    PD_RETURN_IF_ERROR(AttentionBlock(layer, chunks, cache));
    if (observer != nullptr) observer->OnLayerDone(layer);
    PD_RETURN_IF_ERROR(MlpBlock(layer));
  }

  // Logits only for the rows that want them (on every rank of a TP group: they gather them).
  std::vector<float> rank_logits;
  if (logits == nullptr && tp_.size > 1) logits = &rank_logits;
  if (logits != nullptr) {
    std::vector<int> rows;
    row = 0;
    for (const SequenceChunk& c : chunks) {
      row += static_cast<int>(c.tokens.size());
      if (c.want_logits) rows.push_back(row - 1);
    }
    const int m = static_cast<int>(rows.size());
    h_.resize(static_cast<size_t>(m) * hidden);
    for (int i = 0; i < m; ++i) {
      std::memcpy(&h_[static_cast<size_t>(i) * hidden], &x_[static_cast<size_t>(rows[i]) * hidden],
                  hidden * sizeof(float));
    }
    kernels::RmsNorm(h_.data(), weights_.final_norm.as<float>(), h_.data(), m, hidden,
                     static_cast<float>(config_.rms_norm_eps));
    logits->resize(static_cast<size_t>(m) * config_.vocab_size);
    if (m > 0) {
      PD_RETURN_IF_ERROR(ColumnParallelLinear(h_.data(), m, lm_head_, tp_.vocab, config_.vocab_size,
                                              logits->data()));
    }
  }
  return Status::Ok();
}

Status Transformer::ColumnParallelLinear(const float* x, int m, const Matrix& w, DimRange cols,
                                         int width, float* y) {
  if (tp_.size == 1) {
    Linear(x, m, w, y);
    return Status::Ok();
  }
  if (cols.size() > 0) {
    slice_.resize(static_cast<size_t>(m) * cols.size());
    Linear(x, m, w, slice_.data());
    for (int r = 0; r < m; ++r) {
      std::memcpy(y + static_cast<size_t>(r) * width + cols.begin,
                  &slice_[static_cast<size_t>(r) * cols.size()], cols.size() * sizeof(float));
    }
  }
  return group_->AllGatherColumns(y, m, width, cols.begin, cols.end);
}

Status Transformer::AttentionBlock(int layer, std::span<const SequenceChunk> chunks,
                                   KvCache& cache) {
  const LayerWeights& w = weights_.layers[layer];
  const LayerMatrices& f = layers_[layer];
  const int total = static_cast<int>(positions_.size());
  const int hidden = config_.hidden_size;
  const int hd = config_.head_dim;
  // This rank's heads (all of them without TP): q | k | v of its heads per token row.
  const int q_heads = tp_.q_heads.size();
  const int kv_heads = tp_.kv_heads.size();
  const int q_width = q_heads * hd;
  const int kv_width = kv_heads * hd;
  const int qkv_width = q_width + 2 * kv_width;
  const int attn_width = config_.num_heads * hd;  // the attention output of every head
  const int half = hd / 2;
  const float eps = static_cast<float>(config_.rms_norm_eps);

  h_.resize(x_.size());
  kernels::RmsNorm(x_.data(), w.input_norm.as<float>(), h_.data(), total, hidden, eps);
  qkv_.resize(static_cast<size_t>(total) * qkv_width);
  Linear(h_.data(), total, f.qkv, qkv_.data());

#pragma omp parallel for schedule(static) if (static_cast <int64_t>(total) * qkv_width >= 65536)
  for (int t = 0; t < total; ++t) {
    float* q = &qkv_[static_cast<size_t>(t) * qkv_width];
    float* k = q + q_width;
    float* v = k + kv_width;
    if (!f.qkv_bias.empty()) {
      const float* b = f.qkv_bias.as<float>();
      for (int i = 0; i < qkv_width; ++i) q[i] += b[i];
    }
    if (config_.qk_norm) {
      kernels::RmsNorm(q, w.q_norm.as<float>(), q, q_heads, hd, eps);
      kernels::RmsNorm(k, w.k_norm.as<float>(), k, kv_heads, hd, eps);
    }
    const float* c = &cos_[static_cast<size_t>(t) * half];
    const float* s = &sin_[static_cast<size_t>(t) * half];
    kernels::ApplyRope(q, q_heads, hd, c, s);
    kernels::ApplyRope(k, kv_heads, hd, c, s);
    const SequenceChunk& chunk = chunks[token_chunk_[t]];
    const int64_t pos = positions_[t];
    kernels::StoreKv(cache, layer, chunk.pages[pos / cache.layout().page_tokens],
                     static_cast<int>(pos % cache.layout().page_tokens), k, v);
  }

  // Each rank writes its heads' outputs into their columns of the whole attention output.
  attn_.resize(static_cast<size_t>(total) * attn_width);
  std::vector<kernels::AttentionQuery> queries(total);
  for (int t = 0; t < total; ++t) {
    queries[t] = {.q = &qkv_[static_cast<size_t>(t) * qkv_width],
                  .out = &attn_[static_cast<size_t>(t) * attn_width + tp_.q_heads.begin * hd],
                  .pages = chunks[token_chunk_[t]].pages.data(),
                  .context_len = positions_[t] + 1};
  }
  kernels::PagedAttention(queries, cache, layer, q_heads, 1.0f / std::sqrt(static_cast<float>(hd)));
  if (tp_.size > 1) {
    PD_RETURN_IF_ERROR(group_->AllGatherColumns(attn_.data(), total, attn_width,
                                                tp_.q_heads.begin * hd, tp_.q_heads.end * hd));
  }

  tmp_.resize(x_.size());
  PD_RETURN_IF_ERROR(
      ColumnParallelLinear(attn_.data(), total, f.o_proj, tp_.hidden, hidden, tmp_.data()));
  for (size_t i = 0; i < x_.size(); ++i) x_[i] += tmp_[i];
  return Status::Ok();
}

Status Transformer::MlpBlock(int layer) {
  const LayerWeights& w = weights_.layers[layer];
  const LayerMatrices& f = layers_[layer];
  const int total = static_cast<int>(positions_.size());
  const int hidden = config_.hidden_size;
  const int inter = config_.intermediate_size;
  const int local = tp_.intermediate.size();  // this rank's gate and up columns

  kernels::RmsNorm(x_.data(), w.post_norm.as<float>(), h_.data(), total, hidden,
                   static_cast<float>(config_.rms_norm_eps));
  gate_up_.resize(static_cast<size_t>(total) * 2 * local);
  act_.resize(static_cast<size_t>(total) * inter);
  if (local > 0) {  // a rank may hold no column of them (more ranks than columns to share)
    Linear(h_.data(), total, f.gate_up, gate_up_.data());
#pragma omp parallel for schedule(static) if (static_cast <int64_t>(total) * local >= 65536)
    for (int t = 0; t < total; ++t) {
      const float* g = gate_up_.data() + static_cast<size_t>(t) * 2 * local;
      kernels::SiluMul(g, g + local,
                       act_.data() + static_cast<size_t>(t) * inter + tp_.intermediate.begin,
                       local);
    }
  }
  if (tp_.size > 1) {
    PD_RETURN_IF_ERROR(group_->AllGatherColumns(act_.data(), total, inter, tp_.intermediate.begin,
                                                tp_.intermediate.end));
  }
  PD_RETURN_IF_ERROR(
      ColumnParallelLinear(act_.data(), total, f.down, tp_.hidden, hidden, tmp_.data()));
  for (size_t i = 0; i < x_.size(); ++i) x_[i] += tmp_[i];
  return Status::Ok();
}

}  // namespace pdserve
