// Transformer: the forward pass of a Llama-family decoder over the paged KV cache.
//
// One call runs a batch of sequence chunks (prefill chunks and decode steps mixed): it writes
// each token's K/V into the cache pages of its sequence and returns logits for the chunks that
// ask for them. Not thread-safe: the engine's loop thread owns it (kernels use OpenMP inside).
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
#include "model/config.h"
#include "model/tp_group.h"
#include "model/weights.h"

namespace pdserve {

// Tokens [start, start + tokens.size()) of one sequence. `pages` must already cover positions
// [0, start + tokens.size()); positions before `start` must already be in the cache.
struct SequenceChunk {
  std::span<const int32_t> tokens;
  int64_t start = 0;
  std::span<const PageId> pages;
  bool want_logits = false;  // logits of the chunk's last token
};

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
};

// [begin, end) of a dimension: a rank's heads or output columns.
struct DimRange {
  int begin = 0;
  int end = 0;
  int size() const { return end - begin; }
};

// One rank's share of a model under tensor parallelism (the whole model when size is 1).
struct TpSlices {
  int rank = 0;
  int size = 1;
  DimRange q_heads, kv_heads;  // attention heads of this rank
  DimRange hidden;             // output columns of o_proj and down_proj
  DimRange intermediate;       // output columns of gate_proj and up_proj
  DimRange vocab;              // output columns of the lm_head
  // Errors: rank outside [0, size), a query-head group that the replicas of a KV head cannot
  // split evenly (kv_heads < size).
  static Result<TpSlices> Create(const ModelConfig& config, int rank, int size);
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
  void SetTpGroup(TpGroup* group) { group_ = group; }
  // The KV layout of this rank's cache of `num_pages` pages (its KV heads only).
  KvLayout MakeKvLayout(int num_pages, int page_tokens) const;
  // Bytes of weights read per decode step (every matrix once).
  size_t WeightBytes() const;
  // The kernel path this model runs on (kernels/dispatch.h), the one active when it was
  // created; Forward fails if another has been selected since. Paths may differ in the last
  // bits, so a KV cache is reproduced bit for bit only by the path that wrote it.
  std::string_view kernel_path() const { return kernel_path_; }
  // What a peer must match to continue this model's KV cache: the config's fingerprint
  // (ModelConfig::Fingerprint) extended with the kernel path.
  uint64_t Fingerprint() const;

  // Runs the chunks on the calling thread with a team of `threads` (TransformerOptions). logits
  // receives one row of vocab_size floats per chunk with want_logits, in chunk order. Errors: empty
  // chunk, pages not covering the tokens, position beyond the model's context, token id out of
  // range, cache layout not matching this model. With TP, every rank runs Forward with the same
  // chunks on its own cache (and gets the same logits); a failed group fails the pass.
  Status Forward(std::span<const SequenceChunk> chunks, KvCache& cache, std::vector<float>* logits,
                 LayerObserver* observer = nullptr);
  // The checks Forward makes first (a TP leader makes them before handing a step to its
  // ranks, so that a bad batch fails alone rather than failing the group).
  Status Validate(std::span<const SequenceChunk> chunks, const KvCache& cache) const;

 private:
  // A weight matrix [n][k] as the kernels take it: BF16 packed by kernels::PackBF16 (inside
  // packed_arena_), or F32 row-major.
  struct Matrix {
    const uint16_t* bf16 = nullptr;
    Tensor f32;
    int n = 0;
    int k = 0;
  };
  struct LayerMatrices;
  // Packs a BF16 matrix at *cursor in the arena (and advances it), or keeps an F32 one.
  static Matrix ToMatrix(Tensor w, uint16_t** cursor);
  static size_t MatrixBytes(const Matrix& m);  // bytes a product reads
  Transformer(ModelConfig config, ModelWeights weights, DType kv_dtype, int threads, TpSlices tp);
  // y[m][n] = x[m][k] * w^T, in the weight's dtype.
  void Linear(const float* x, int m, const Matrix& w, float* y);
  // y[m][width] = x * W^T where this rank holds W's rows `cols` (as w): computes its columns
  // and gathers the others' (with one rank, a plain Linear into y).
  Status ColumnParallelLinear(const float* x, int m, const Matrix& w, DimRange cols, int width,
                              float* y);
  // The embedding of `token` as floats (from the output matrix when the two are tied).
  void EmbedRow(int32_t token, float* out) const;
  Status AttentionBlock(int layer, std::span<const SequenceChunk> chunks, KvCache& cache);
  Status MlpBlock(int layer);

  ModelConfig config_;
  ModelWeights weights_;
  // Every packed BF16 matrix, back to back in the order a forward pass reads them, in one
  // allocation of whole 2 MB pages. With separate allocations the small matrices (q|k|v,
  // o_proj) read several times slower after the large ones streamed past, most likely from 4 KB
  // pages (a TLB miss each, a nested page walk in a VM; measured: docs/kernels.md, "BF16
  // products").
  Tensor packed_arena_;
  std::vector<LayerMatrices> layers_;
  Matrix lm_head_;
  DType kv_dtype_;                // F32 or BF16
  std::string_view kernel_path_;  // a name with static storage (kernels::ActivePath)
  int threads_;                   // 0: the runtime's default
  TpSlices tp_;
  TpGroup* group_ = nullptr;      // with tp_.size > 1
  std::vector<double> inv_freq_;  // RoPE inverse frequencies (with rope scaling applied)

  // Workspace, reused across calls (sized for the largest batch seen).
  std::vector<float> x_, h_, qkv_, attn_, tmp_, gate_up_, act_, cos_, sin_, slice_;
  std::vector<uint16_t> x_bf16_;
  std::vector<int64_t> positions_;
  std::vector<int> token_chunk_;
};

// RoPE inverse frequencies for a config (rotate_half pairs i and i + head_dim/2), with
// Llama-3 or linear rope scaling applied.
std::vector<double> RopeInverseFrequencies(const ModelConfig& config);

}  // namespace pdserve
