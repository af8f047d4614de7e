#include "model/transformer.h"

#include <omp.h>

#include <string>
#include <utility>

#include <fmt/format.h>

#include "kernels/dispatch.h"
#include "model/dense_mlp.h"
#include "model/gqa_attention.h"
#include "model/matrix.h"
#include "model/mla_attention.h"
#include "model/moe_mlp.h"

namespace pdserve {

Result<std::unique_ptr<Transformer>> Transformer::Create(ModelConfig config, ModelWeights weights,
                                                         const TransformerOptions& options) {
  if (!config.is_mla() && (config.head_dim % 2 != 0 || config.head_dim > 256)) {
    return Status::InvalidArgument(
        fmt::format("head_dim {} unsupported (must be even and <= 256)", config.head_dim));
  }
  if (static_cast<int>(weights.layers.size()) != config.num_layers ||
      static_cast<int>(weights.mtp.size()) != config.num_nextn_predict_layers) {
    return Status::InvalidArgument("weights do not match the config's layer count");
  }
  if (options.threads < 0) return Status::InvalidArgument("threads must be >= 0");
  if (options.mtp_kv && config.num_nextn_predict_layers < 1) {
    return Status::InvalidArgument(
        "speculative decoding with MTP needs a model with an MTP module "
        "(num_nextn_predict_layers >= 1 in config.json)");
  }
  const DType kv =
      options.kv_dtype.value_or(weights.matrix_dtype == DType::kF32 ? DType::kF32 : DType::kBF16);
  PD_RETURN_IF_ERROR(CheckKvCacheDType(kv));
  PD_ASSIGN_OR_RETURN(TpSlices tp, TpSlices::Create(config, options.tp_rank, options.tp_size));
  return std::unique_ptr<Transformer>(new Transformer(std::move(config), std::move(weights), kv,
                                                      options.threads, tp, options.mtp_kv));
}

Transformer::Transformer(ModelConfig config, ModelWeights weights, DType kv_dtype, int threads,
                         TpSlices tp, bool mtp_kv)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      kv_dtype_(kv_dtype),
      kernel_path_(kernels::ActivePath()),
      threads_(threads),
      tp_(tp),
      linear_(tp.size),
      mtp_kv_(mtp_kv),
      rope_(config_),
      mtp_state_(config_) {
  // The blocks add their matrices in the order a forward pass reads them (each layer's, then the
  // lm_head), and the packer lays them out in that order; the MTP modules, which the pass does
  // not read, come after them.
  MatrixPacker packer;
  layers_.reserve(weights_.layers.size());
  for (int i = 0; i < config_.num_layers; ++i) {
    layers_.push_back(MakeLayer(i, weights_.layers[i], packer));
  }
  head_ = std::make_unique<EmbeddingHead>(config_, tp_, weights_, packer);
  mtp_.resize(weights_.mtp.size());  // sized first: the packer keeps pointers into them
  for (int k = 0; k < config_.num_nextn_predict_layers; ++k) MakeMtpLayer(k, packer, mtp_[k]);
  packed_arena_ = packer.Pack();
}

Transformer::~Transformer() = default;

void Transformer::MakeMtpLayer(int k, MatrixPacker& packer, MtpLayer& out) {
  // Split as the layers are (DESIGN.md §1): speculative decoding runs an MTP module on every
  // rank, through the same gathers, so each rank holds its share and no rank holds it all.
  MtpModule& m = weights_.mtp[k];
  packer.Add({{&m.eh_proj, tp_.hidden}}, &out.eh_proj);
  out.layer = MakeLayer(config_.num_layers + k, m.layer, packer);
  if (!m.head.empty()) packer.Add({{&m.head, tp_.vocab}}, &out.head);
}

Transformer::Layer Transformer::MakeLayer(int layer, LayerWeights& w, MatrixPacker& packer) {
  // Attention is MLA over a latent cache (DeepSeek) or GQA (the others); the feed-forward is
  // the experts in the config's MoE layers and a dense SwiGLU MLP in the others.
  std::unique_ptr<LayerBlock> attention;
  if (config_.is_mla()) {
    attention = std::make_unique<MlaAttention>(config_, tp_, layer, w, packer);
  } else {
    attention = std::make_unique<GqaAttention>(config_, tp_, layer, w, packer);
  }
  std::unique_ptr<LayerBlock> feed_forward;
  if (config_.IsMoeLayer(layer)) {
    feed_forward = std::make_unique<MoeMlp>(config_, tp_, layer, w, packer);
  } else {
    feed_forward = std::make_unique<DenseMlp>(config_, tp_, w, packer);
  }
  return Layer{.attention = std::move(attention), .feed_forward = std::move(feed_forward)};
}

KvLayout Transformer::MakeKvLayout(int num_pages, int page_tokens) const {
  return KvLayout{.num_layers = config_.num_layers + (mtp_kv_ ? 1 : 0),
                  .num_kv_heads = tp_.kv_heads.size(),
                  .head_dim = config_.head_dim,
                  .page_tokens = page_tokens,
                  .dtype = kv_dtype_,
                  .num_pages = num_pages,
                  .kind = config_.is_mla() ? KvKind::kLatent : KvKind::kGqa};
}

size_t Transformer::WeightBytes() const {
  size_t bytes = head_->WeightBytes();
  for (const Layer& l : layers_)
    bytes += l.attention->WeightBytes() + l.feed_forward->WeightBytes();
  return bytes;
}

size_t Transformer::MtpWeightBytes() const {
  size_t bytes = 0;
  for (const MtpLayer& m : mtp_) {
    bytes += m.eh_proj.bytes() + m.layer.attention->WeightBytes() +
             m.layer.feed_forward->WeightBytes() + m.head.bytes();
  }
  return bytes;
}

size_t Transformer::StepWeightBytes(const RoutingTrace& trace) const {
  size_t bytes = head_->WeightBytes();
  for (const Layer& l : layers_) {
    bytes += l.attention->StepWeightBytes(trace) + l.feed_forward->StepWeightBytes(trace);
  }
  return bytes;
}

uint64_t Transformer::Fingerprint() const {
  // FNV-1a, continued from the config's hash over "kernels=<path>" and, for linear layers held
  // in 8 bits, " weights=<fp8|int8>" (a BF16 checkpoint quantised at load computes other KV),
  // and for an 8-bit output matrix " head=int8" (no KV changes, but the logits do: TP ranks
  // must agree on it, and a prefix cache holds logits-free KV, so only its salt changes).
  uint64_t h = config_.Fingerprint();
  std::string text = std::string("kernels=") + std::string(kernel_path_);
  if (IsBlockScaled(weights_.linear_dtype)) {
    text += " weights=" + std::string(DTypeFlagName(weights_.linear_dtype));
  }
  if (IsBlockScaled(weights_.head_dtype)) {
    text += " head=" + std::string(DTypeFlagName(weights_.head_dtype));
  }
  if (mtp_kv_) text += " mtp-kv";
  for (char ch : text) {
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
  const TpGroup* group = linear_.group();
  if (tp_.size > 1 &&
      (group == nullptr || group->size() != tp_.size || group->rank() != tp_.rank)) {
    return Status::FailedPrecondition(
        fmt::format("tensor-parallel rank {} of {} has no matching group", tp_.rank, tp_.size));
  }
  if (l.num_layers != config_.num_layers + (mtp_kv_ ? 1 : 0) ||
      l.num_kv_heads != tp_.kv_heads.size() || l.head_dim != config_.head_dim ||
      l.dtype != kv_dtype_ || l.kind != (config_.is_mla() ? KvKind::kLatent : KvKind::kGqa)) {
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
    if (c.want_logits && (c.logit_rows < 1 || c.logit_rows > static_cast<int>(c.tokens.size()))) {
      return Status::InvalidArgument(
          fmt::format("{} logit rows of a chunk of {} tokens", c.logit_rows, c.tokens.size()));
    }
    if (c.hidden_rows < 0 || c.hidden_rows > static_cast<int>(c.tokens.size()) ||
        c.mtp_tokens.size() > c.tokens.size()) {
      return Status::InvalidArgument(
          fmt::format("{} hidden rows and {} MTP entries in a chunk of {} tokens", c.hidden_rows,
                      c.mtp_tokens.size(), c.tokens.size()));
    }
    if (!c.mtp_tokens.empty() && !mtp_kv_) {
      return Status::InvalidArgument("MTP entries asked of a model without its MTP KV layer");
    }
    for (std::span<const int32_t> ids : {c.tokens, c.mtp_tokens}) {
      for (int32_t t : ids) {
        if (t < 0 || t >= config_.vocab_size) {
          return Status::InvalidArgument(
              fmt::format("token id {} out of range [0, {})", t, config_.vocab_size));
        }
      }
    }
  }
  return Status::Ok();
}

Status Transformer::Forward(std::span<const SequenceChunk> chunks, KvCache& cache,
                            std::vector<float>* logits, LayerObserver* observer,
                            std::vector<float>* hidden_out) {
  PD_RETURN_IF_ERROR(Validate(chunks, cache));
  // The team size is an OpenMP setting of the calling thread (and the oneDNN calls inherit it),
  // so it is applied here, on the thread that runs the pass (the engine's loop thread), not once
  // in Create on whichever thread built the model.
  if (threads_ > 0 && omp_get_max_threads() != threads_) omp_set_num_threads(threads_);
  const int hidden = config_.hidden_size;
  int total = 0;
  for (const SequenceChunk& c : chunks) total += static_cast<int>(c.tokens.size());

  // Token rows: embeddings, positions and the RoPE angles of each position.
  x_.resize(static_cast<size_t>(total) * hidden);
  positions_.resize(total);
  row_chunk_.resize(total);
  int row = 0;
  for (int ci = 0; ci < static_cast<int>(chunks.size()); ++ci) {
    const SequenceChunk& c = chunks[ci];
    for (size_t i = 0; i < c.tokens.size(); ++i, ++row) {
      positions_[row] = c.start + static_cast<int64_t>(i);
      row_chunk_[row] = ci;
      head_->Embed(c.tokens[i], &x_[static_cast<size_t>(row) * hidden]);
    }
  }
  rope_.Compute(positions_);
  ForwardPass pass{.chunks = chunks,
                   .cache = cache,
                   .rows = total,
                   .hidden = hidden,
                   .positions = positions_,
                   .row_chunk = row_chunk_,
                   .rope = rope_,
                   .x = x_.data(),
                   .linear = linear_,
                   .workspace = workspace_,
                   .routing = routing_};
  if (routing_ != nullptr) routing_->layers.clear();

  for (int layer = 0; layer < config_.num_layers; ++layer) {
    PD_RETURN_IF_ERROR(layers_[layer].attention->Run(pass));
    if (observer != nullptr) observer->OnLayerDone(layer);
    PD_RETURN_IF_ERROR(layers_[layer].feed_forward->Run(pass));
  }

  // The final-normed hidden states the caller keeps, and those the MTP entries start from.
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const float* final_norm = weights_.final_norm.as<float>();
  if (hidden_out != nullptr) {
    hidden_out->clear();
    row = 0;
    for (const SequenceChunk& c : chunks) {
      row += static_cast<int>(c.tokens.size());
      const size_t at = hidden_out->size();
      hidden_out->resize(at + static_cast<size_t>(c.hidden_rows) * hidden);
      kernels::RmsNorm(&x_[static_cast<size_t>(row - c.hidden_rows) * hidden], final_norm,
                       hidden_out->data() + at, c.hidden_rows, hidden, eps);
    }
  }
  if (mtp_kv_) {
    MtpState& st = mtp_state_;
    st.chunks.clear();
    st.h.clear();
    row = 0;
    for (const SequenceChunk& c : chunks) {
      const size_t m = c.mtp_tokens.size();
      if (m > 0) {
        st.chunks.push_back({.tokens = c.mtp_tokens, .start = c.start, .pages = c.pages});
        const size_t at = st.h.size();
        st.h.resize(at + m * hidden);
        kernels::RmsNorm(&x_[static_cast<size_t>(row) * hidden], final_norm, st.h.data() + at,
                         static_cast<int>(m), hidden, eps);
      }
      row += static_cast<int>(c.tokens.size());
    }
    if (!st.chunks.empty()) {
      const std::vector<float> h = std::move(st.h);  // RunMtp reuses the state's buffers
      const std::vector<SequenceChunk> mtp_chunks = std::move(st.chunks);
      PD_RETURN_IF_ERROR(RunMtp(mtp_chunks, h.data(), cache, nullptr, nullptr));
    }
    if (observer != nullptr) observer->OnLayerDone(config_.num_layers);
  }

  // Logits only for the rows that want them (on every rank of a TP group: they gather them).
  std::vector<float> rank_logits;
  if (logits == nullptr && tp_.size > 1) logits = &rank_logits;
  if (logits == nullptr) return Status::Ok();
  return ChunkLogits(pass, weights_.final_norm, head_->lm_head(), logits);
}

Status Transformer::ChunkLogits(ForwardPass& pass, const Tensor& norm, const Matrix& head,
                                std::vector<float>* logits) {
  std::vector<int> rows;
  int row = 0;
  for (const SequenceChunk& c : pass.chunks) {
    row += static_cast<int>(c.tokens.size());
    if (!c.want_logits) continue;
    for (int i = c.logit_rows; i >= 1; --i) rows.push_back(row - i);
  }
  logits->resize(rows.size() * static_cast<size_t>(config_.vocab_size));
  return head_->Logits(pass, rows, norm, head, logits->data());
}

Status Transformer::ForwardMtp(std::span<const SequenceChunk> chunks,
                               std::span<const float> hidden_in, KvCache& cache,
                               std::vector<float>* logits, std::vector<float>* hidden_out) {
  if (!mtp_kv_) return Status::FailedPrecondition("this model was loaded without its MTP KV layer");
  PD_RETURN_IF_ERROR(Validate(chunks, cache));
  size_t total = 0;
  for (const SequenceChunk& c : chunks) total += c.tokens.size();
  if (hidden_in.size() != total * config_.hidden_size) {
    return Status::InvalidArgument(fmt::format("{} hidden floats for {} MTP rows of {}",
                                               hidden_in.size(), total, config_.hidden_size));
  }
  if (threads_ > 0 && omp_get_max_threads() != threads_) omp_set_num_threads(threads_);
  return RunMtp(chunks, hidden_in.data(), cache, logits, hidden_out);
}

Status Transformer::RunMtp(std::span<const SequenceChunk> chunks, const float* hidden_in,
                           KvCache& cache, std::vector<float>* logits,
                           std::vector<float>* hidden_out) {
  // DeepSeek-V3's MTP module (its paper, section 2.2): eh_proj([enorm(embed(token));
  // hnorm(h)]), then a decoder layer, whose output feeds the shared head (shared_head.norm,
  // then its head or the model's lm_head) and, chained, the next pass as its h.
  MtpState& st = mtp_state_;
  const MtpModule& w = weights_.mtp[0];
  MtpLayer& module = mtp_[0];
  const int hidden = config_.hidden_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  int total = 0;
  for (const SequenceChunk& c : chunks) total += static_cast<int>(c.tokens.size());
  st.positions.resize(total);
  st.row_chunk.resize(total);
  st.cat.resize(static_cast<size_t>(total) * 2 * hidden);
  int row = 0;
  for (int ci = 0; ci < static_cast<int>(chunks.size()); ++ci) {
    const SequenceChunk& c = chunks[ci];
    for (size_t i = 0; i < c.tokens.size(); ++i, ++row) {
      st.positions[row] = c.start + static_cast<int64_t>(i);
      st.row_chunk[row] = ci;
      float* e = &st.cat[static_cast<size_t>(row) * 2 * hidden];
      head_->Embed(c.tokens[i], e);
      kernels::RmsNorm(e, w.enorm.as<float>(), e, 1, hidden, eps);
      kernels::RmsNorm(hidden_in + static_cast<size_t>(row) * hidden, w.hnorm.as<float>(),
                       e + hidden, 1, hidden, eps);
    }
  }
  st.x.resize(static_cast<size_t>(total) * hidden);
  if (total > 0) {
    PD_RETURN_IF_ERROR(linear_.ColumnParallelLinear(st.cat.data(), total, module.eh_proj,
                                                    tp_.hidden, hidden, st.x.data()));
  }
  st.rope.Compute(st.positions);
  ForwardPass pass{.chunks = chunks,
                   .cache = cache,
                   .rows = total,
                   .hidden = hidden,
                   .positions = st.positions,
                   .row_chunk = st.row_chunk,
                   .rope = st.rope,
                   .x = st.x.data(),
                   .linear = linear_,
                   .workspace = workspace_};
  if (total > 0) {
    PD_RETURN_IF_ERROR(module.layer.attention->Run(pass));
    PD_RETURN_IF_ERROR(module.layer.feed_forward->Run(pass));
  }
  if (hidden_out != nullptr) hidden_out->assign(st.x.begin(), st.x.end());
  if (logits == nullptr) return Status::Ok();
  return ChunkLogits(pass, w.head_norm, module.head.n == 0 ? head_->lm_head() : module.head,
                     logits);
}

}  // namespace pdserve
