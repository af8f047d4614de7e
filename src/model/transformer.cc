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
  const DType kv =
      options.kv_dtype.value_or(weights.matrix_dtype == DType::kF32 ? DType::kF32 : DType::kBF16);
  PD_RETURN_IF_ERROR(CheckKvCacheDType(kv));
  PD_ASSIGN_OR_RETURN(TpSlices tp, TpSlices::Create(config, options.tp_rank, options.tp_size));
  return std::unique_ptr<Transformer>(
      new Transformer(std::move(config), std::move(weights), kv, options.threads, tp));
}

Transformer::Transformer(ModelConfig config, ModelWeights weights, DType kv_dtype, int threads,
                         TpSlices tp)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      kv_dtype_(kv_dtype),
      kernel_path_(kernels::ActivePath()),
      threads_(threads),
      tp_(tp),
      linear_(tp.size),
      rope_(config_) {
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
  return KvLayout{.num_layers = config_.num_layers,
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
  // in 8 bits, " weights=<fp8|int8>" (a BF16 checkpoint quantised at load computes other KV).
  uint64_t h = config_.Fingerprint();
  std::string text = std::string("kernels=") + std::string(kernel_path_);
  if (IsBlockScaled(weights_.linear_dtype)) {
    text += " weights=" + std::string(DTypeFlagName(weights_.linear_dtype));
  }
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
  if (l.num_layers != config_.num_layers || l.num_kv_heads != tp_.kv_heads.size() ||
      l.head_dim != config_.head_dim || l.dtype != kv_dtype_ ||
      l.kind != (config_.is_mla() ? KvKind::kLatent : KvKind::kGqa)) {
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

  // Logits only for the rows that want them (on every rank of a TP group: they gather them).
  std::vector<float> rank_logits;
  if (logits == nullptr && tp_.size > 1) logits = &rank_logits;
  if (logits != nullptr) {
    std::vector<int> rows;
    row = 0;
    for (const SequenceChunk& c : chunks) {
      row += static_cast<int>(c.tokens.size());
      if (!c.want_logits) continue;
      for (int i = c.logit_rows; i >= 1; --i) rows.push_back(row - i);
    }
    logits->resize(rows.size() * static_cast<size_t>(config_.vocab_size));
    PD_RETURN_IF_ERROR(head_->Logits(pass, rows, logits->data()));
  }
  return Status::Ok();
}

}  // namespace pdserve
