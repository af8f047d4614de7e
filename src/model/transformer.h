// Transformer: the forward pass of a Llama-family decoder over the paged KV cache.
//
// One call runs a batch of sequence chunks (prefill chunks and decode steps mixed): it writes
// each token's K/V into the cache pages of its sequence and returns logits for the chunks that
// ask for them. The model is the embedding, then per layer an attention block and a feed-forward
// block (model/block.h, each kind a class of its own, chosen per layer from the config), then the
// final norm and lm_head (model/embedding_head.h). Not thread-safe: the engine's loop thread owns
// it (kernels use OpenMP inside).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "kv/kv_cache.h"
#include "kv/layout.h"
#include "model/block.h"
#include "model/config.h"
#include "model/embedding_head.h"
#include "model/forward_pass.h"
#include "model/rope.h"
#include "model/tp_group.h"
#include "model/tp_linear.h"
#include "model/tp_slices.h"
#include "model/weights.h"

namespace pdserve {

// Told after each layer's attention output projection (DESIGN.md §3: the layer-progress hook
// that the KV messenger watches). Called on the forward thread.
class LayerObserver {
 public:
  virtual ~LayerObserver() = default;
  virtual void OnLayerDone(int layer) = 0;
};

struct TransformerOptions {
  // OpenMP team size of the forward pass; 0 = the runtime's default (OMP_NUM_THREADS or the
  // cores). Applied by Forward on whichever thread runs it: OpenMP's setting is per thread.
  int threads = 0;
  // KV cache element type, F32 or BF16 (Create refuses others); nullopt: F32 for F32 weights,
  // BF16 otherwise.
  std::optional<DType> kv_dtype;
  // Tensor parallelism (DESIGN.md §1): this model is rank `tp_rank` of `tp_size`. It holds
  // only its share of each matrix — the query heads of its KV heads
  // (KvShardLayout::ForTensorParallel), and a contiguous slice of the output columns of the
  // attention output projection, the MLP and the lm_head — and its cache holds only its KV
  // heads. Each product's slices are all-gathered (TpGroup, set with SetTpGroup) rather than
  // partial sums all-reduced, so every output element is reduced in the one-rank order and
  // the ranks' logits equal one rank's bit for bit.
  int tp_rank = 0;
  int tp_size = 1;
  // Speculative decoding with the MTP module (needs config.num_nextn_predict_layers >= 1): the
  // cache gets one more KV layer, num_layers, for MTP module 0; Forward computes its entries
  // for the rows SequenceChunk::mtp_tokens names and ForwardMtp drafts from it. Part of the
  // fingerprint: a peer without it cannot continue this cache.
  bool mtp_kv = false;
};

class Transformer {
 public:
  static Result<std::unique_ptr<Transformer>> Create(ModelConfig config, ModelWeights weights,
                                                     const TransformerOptions& options);
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;
  ~Transformer();

  const ModelConfig& config() const { return config_; }
  DType kv_dtype() const { return kv_dtype_; }
  const TpSlices& tp() const { return tp_; }
  // The group this rank gathers with; required before Forward when tp().size > 1. Not owned.
  void SetTpGroup(TpGroup* group) { linear_.set_group(group); }
  // When set, each Forward replaces *trace with what its MoE layers chose (none for a dense
  // model). Not owned; nullptr turns it off.
  void set_routing_trace(RoutingTrace* trace) { routing_ = trace; }
  // The KV layout of this rank's cache of `num_pages` pages (its KV heads only).
  KvLayout MakeKvLayout(int num_pages, int page_tokens) const;
  // Bytes of weights read per decode step (every matrix once; not the MTP modules).
  size_t WeightBytes() const;
  // Of those, the output matrix's (this rank's share).
  size_t HeadWeightBytes() const { return head_->WeightBytes(); }
  // The multi-token-prediction modules (config.num_nextn_predict_layers): this rank's share of
  // each is packed as a decoder layer's is. With TransformerOptions::mtp_kv, module 0 runs
  // (Forward's MTP entries, ForwardMtp) over KV layer num_layers; the others never run.
  int mtp_modules() const { return static_cast<int>(mtp_.size()); }
  bool mtp_kv() const { return mtp_kv_; }
  // Bytes of this rank's share of the MTP modules' matrices.
  size_t MtpWeightBytes() const;
  // Bytes of weights the pass that filled `trace` (set_routing_trace) read: WeightBytes but
  // for the experts no row chose.
  size_t StepWeightBytes(const RoutingTrace& trace) const;
  // The kernel path this model runs on (kernels/dispatch.h), the one active when it was
  // created; Forward fails if another has been selected since. Paths may differ in the last
  // bits, so a KV cache is reproduced bit for bit only by the path that wrote it.
  std::string_view kernel_path() const { return kernel_path_; }
  // What every TP rank of this model must match: the config's fingerprint
  // (ModelConfig::Fingerprint) extended with the kernel path, when the linear layers are held
  // in 8 bits their format (ModelWeights::linear_dtype), when the output matrix is 8-bit its
  // format (ModelWeights::head_dtype: it changes the logits, not the KV, so the messenger's
  // handshake, which pairs nodes by the KV they compute, does not compare it), and the MTP KV
  // layer (mtp_kv). Also the prefix cache's salt.
  uint64_t Fingerprint() const;
  // The dtype the linear layers' matrices are held in (ModelWeights::linear_dtype).
  DType linear_dtype() const { return weights_.linear_dtype; }
  // The dtype the output matrix is held in (ModelWeights::head_dtype): kI8 or matrix_dtype.
  DType head_dtype() const { return weights_.head_dtype; }
  // The dtype every other matrix is held in (ModelWeights::matrix_dtype), as resolved at load.
  DType matrix_dtype() const { return weights_.matrix_dtype; }

  // Runs the chunks on the calling thread with a team of `threads` (TransformerOptions). logits
  // receives logit_rows rows of vocab_size floats per chunk with want_logits, in chunk order.
  // Errors: empty chunk, pages not covering the tokens, position beyond the model's context, token
  // id out of range, cache layout not matching this model. With TP, every rank runs Forward with
  // the same chunks on its own cache (and gets the same logits); a failed group fails the pass.
  // With mtp_kv, the chunks' MTP entries (SequenceChunk::mtp_tokens) are computed after the
  // last layer, and the observer hears of layer num_layers after them (every pass, entries or
  // none). `hidden`, when set, receives the hidden_rows rows of hidden_size floats per chunk.
  Status Forward(std::span<const SequenceChunk> chunks, KvCache& cache, std::vector<float>* logits,
                 LayerObserver* observer = nullptr, std::vector<float>* hidden = nullptr);
  // One drafting pass of MTP module 0 (mtp_kv): chunk row r at position start + r combines the
  // embedding of its token with hidden_in's row r ([rows][hidden_size]: the target's
  // final-normed hidden state of the position before, or an earlier MTP pass's hidden_out),
  // writes its KV to layer num_layers, and leaves in hidden_out its output hidden state (before
  // the head's norm) and in logits, for the chunks with want_logits, the MTP head's logits of
  // the last logit_rows rows. With TP every rank runs it with the same arguments.
  Status ForwardMtp(std::span<const SequenceChunk> chunks, std::span<const float> hidden_in,
                    KvCache& cache, std::vector<float>* logits, std::vector<float>* hidden_out);
  // The checks Forward makes first (a TP leader makes them before handing a step to its
  // ranks, so that a bad batch fails alone rather than failing the group).
  Status Validate(std::span<const SequenceChunk> chunks, const KvCache& cache) const;

 private:
  // A decoder layer: its attention block, then its feed-forward block.
  struct Layer {
    std::unique_ptr<LayerBlock> attention;
    std::unique_ptr<LayerBlock> feed_forward;
  };
  // An MTP module (ModelWeights::mtp): its decoder layer's blocks (of layer index num_layers +
  // k), and this rank's output columns of eh_proj and of its own head, if it has one.
  struct MtpLayer {
    Matrix eh_proj;  // [hidden, 2 * hidden]: output columns tp.hidden
    Layer layer;
    Matrix head;  // [vocab, hidden]: columns tp.vocab; empty: the model's lm_head serves
  };
  Transformer(ModelConfig config, ModelWeights weights, DType kv_dtype, int threads, TpSlices tp,
              bool mtp_kv);
  // MTP module 0 over `chunks` (ForwardMtp's contract); the rows' hidden inputs at `hidden_in`.
  Status RunMtp(std::span<const SequenceChunk> chunks, const float* hidden_in, KvCache& cache,
                std::vector<float>* logits, std::vector<float>* hidden_out);
  // The logits of the chunks' last logit_rows rows (those with want_logits) of `pass`, through
  // `norm` and `head` (the model's or an MTP module's); on every rank with TP.
  Status ChunkLogits(ForwardPass& pass, const Tensor& norm, const Matrix& head,
                     std::vector<float>* logits);
  // The blocks of layer `layer` (weights `w`), chosen from the config; their matrices go to
  // `packer`.
  Layer MakeLayer(int layer, LayerWeights& w, MatrixPacker& packer);
  // Fills `out` (which must stay where it is until the packer packs) with MTP module k.
  void MakeMtpLayer(int k, MatrixPacker& packer, MtpLayer& out);

  ModelConfig config_;
  ModelWeights weights_;  // what the blocks keep of it: the norms (the matrices are packed)
  std::vector<Layer> layers_;
  std::unique_ptr<EmbeddingHead> head_;
  std::vector<MtpLayer> mtp_;  // built, never run by Forward
  // Every packed BF16 matrix, in the order a forward pass reads them (MatrixPacker).
  Tensor packed_arena_;
  DType kv_dtype_;                // F32 or BF16
  std::string_view kernel_path_;  // a name with static storage (kernels::ActivePath)
  int threads_;                   // 0: the runtime's default
  TpSlices tp_;
  TpLinear linear_;  // this rank's products; holds the TP group
  RoutingTrace* routing_ = nullptr;
  bool mtp_kv_ = false;

  // The state of a pass, reused across calls (sized for the largest batch seen).
  RopeAngles rope_;
  Workspace workspace_;
  std::vector<float> x_;  // the residual stream
  std::vector<int64_t> positions_;
  std::vector<int> row_chunk_;
  // An MTP pass's own (Forward runs one after its layers, while x_ still holds its rows).
  struct MtpState {
    explicit MtpState(const ModelConfig& config) : rope(config) {}
    RopeAngles rope;
    std::vector<float> x, h, cat;
    std::vector<int64_t> positions;
    std::vector<int> row_chunk;
    std::vector<SequenceChunk> chunks;
  };
  MtpState mtp_state_;
};

}  // namespace pdserve
