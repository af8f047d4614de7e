// ModelWeights: every tensor of a Llama-family model, owned in memory in the engine's
// weight dtype (matrices: BF16 or F32, or FP8 with their scales as an FP8 checkpoint ships them;
// norms and biases: always F32).
// Immutable after LoadWeights: safe to read from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "model/config.h"

namespace pdserve {

// A dense row-major tensor with 64-byte aligned storage. Move-only.
class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, std::vector<int64_t> shape);  // zero-filled
  // Storage left uninitialised, for callers that overwrite every element (the loader).
  static Tensor Uninitialized(DType dtype, std::vector<int64_t> shape);
  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(Tensor&&) noexcept = default;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t numel() const;  // 0 for an empty (absent) tensor
  size_t nbytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype_); }
  bool empty() const { return shape_.empty(); }
  void* data() { return data_.get(); }
  const void* data() const { return data_.get(); }
  template <typename T>
  T* as() {
    return static_cast<T*>(data());
  }
  template <typename T>
  const T* as() const {
    return static_cast<const T*>(data());
  }

  // An FP8 or INT8 matrix (DType::kF8E4M3 or kI8, [rows][cols]) carries its scales: F32
  // [rows][ceil(cols / kernels::kFp8BlockK)], element (r, j) multiplying row r's values in columns
  // [128j, 128j + 128). They are the checkpoint's block scales, repeated for every row of a block,
  // so that any rows of the matrix can be taken with their scales (model/matrix.h); an INT8
  // matrix's are its own (one per row and block). Empty for every other tensor.
  const Tensor& row_scales() const;
  Tensor* mutable_row_scales() { return row_scales_.get(); }  // null when there are none
  void set_row_scales(Tensor scales);

 private:
  struct FreeDeleter {
    void operator()(void* p) const;
  };
  DType dtype_ = DType::kF32;
  std::vector<int64_t> shape_;
  std::unique_ptr<void, FreeDeleter> data_;
  std::unique_ptr<Tensor> row_scales_;
};

// An FP8 or INT8 matrix (with its row scales) as F32 or BF16: each value fp8 (int8) * scale in
// F32, exactly as the kernels weigh it, then rounded to BF16 (nearest even) for BF16.
Tensor Dequantise8(const Tensor& w, DType to);
inline Tensor DequantiseFp8(const Tensor& fp8, DType to) { return Dequantise8(fp8, to); }
// Whether `dtype` is one of the 8-bit block-scaled weight formats (FP8, INT8).
inline bool IsBlockScaled(DType dtype) { return dtype == DType::kF8E4M3 || dtype == DType::kI8; }

// One SwiGLU expert of an MoE layer: [expert_intermediate, hidden] x2, [hidden, ...].
struct ExpertWeights {
  Tensor gate_proj;
  Tensor up_proj;
  Tensor down_proj;
};

// Matrices follow Hugging Face: [out_features, in_features].
struct LayerWeights {
  Tensor input_norm;              // [hidden] F32
  Tensor q_proj;                  // [heads*head_dim, hidden] (MLA: [heads*q_head_dim, hidden])
  Tensor k_proj;                  // [kv_heads*head_dim, hidden]
  Tensor v_proj;                  // [kv_heads*head_dim, hidden]
  Tensor q_bias, k_bias, v_bias;  // F32, present iff config.qkv_bias
  Tensor q_norm, k_norm;          // [head_dim] F32, present iff config.qk_norm
  Tensor o_proj;                  // [hidden, heads*head_dim] (MLA: [hidden, heads*v_head_dim])
  // MLA (config.is_mla(); k_proj, v_proj empty): q_a/q_b replace q_proj when q_lora_rank > 0.
  Tensor q_a_proj;   // [q_lora_rank, hidden]
  Tensor q_a_norm;   // [q_lora_rank] F32
  Tensor q_b_proj;   // [heads*q_head_dim, q_lora_rank]
  Tensor kv_a_proj;  // [kv_lora_rank + qk_rope_head_dim, hidden] (kv_a_proj_with_mqa)
  Tensor kv_a_norm;  // [kv_lora_rank] F32
  Tensor kv_b_proj;  // [heads*(qk_nope_head_dim + v_head_dim), kv_lora_rank]
  Tensor post_norm;  // [hidden] F32 (post_attention_layernorm)
  // The feed-forward: a dense MLP, or (config.IsMoeLayer) the router and the experts.
  Tensor gate_proj;                    // [intermediate, hidden]
  Tensor up_proj;                      // [intermediate, hidden]
  Tensor down_proj;                    // [hidden, intermediate]
  Tensor router;                       // [num_experts, hidden] F32 (mlp.gate.weight)
  Tensor router_bias;                  // [num_experts] F32: noaux_tc's e_score_correction_bias
  std::vector<ExpertWeights> experts;  // [num_experts]
  ExpertWeights shared;  // DeepSeek's shared experts, [shared * expert_intermediate] wide
};

// One multi-token-prediction module of DeepSeek-V3 (config.num_nextn_predict_layers), stored as
// model.layers.{num_layers + i}.*. It predicts the token after next from the main model's last
// hidden state h and the next token's embedding e: x = eh_proj([enorm(e); hnorm(h)]), then a
// decoder layer (MLA, and the feed-forward its layer index gives: MoE in V3), then
// shared_head.norm and the output head. Loaded for speculative decoding; the plain forward pass
// never reads it.
//
// The embedding is the model's (V3 stores a copy as ...embed_tokens.weight: LoadWeights accepts
// it only byte-identical to model.embed_tokens.weight, and does not load it). The head is
// shared_head.head.weight where the checkpoint holds one that differs from the model's output
// matrix; where it is absent or a copy of it (V3 stores a copy of lm_head: 1.8 GB saved), `head`
// stays empty and the model's output matrix serves.
struct MtpModule {
  Tensor enorm;        // [hidden] F32
  Tensor hnorm;        // [hidden] F32
  Tensor eh_proj;      // [hidden, 2 * hidden]: the normed embedding's columns, then h's
  LayerWeights layer;  // the decoder layer, as any other (FP8 stays FP8)
  Tensor head_norm;    // [hidden] F32 (shared_head.norm)
  Tensor head;         // [vocab, hidden] (shared_head.head); empty: ModelWeights::output_matrix
};

struct ModelWeights {
  DType matrix_dtype = DType::kBF16;  // of every matrix not kept in FP8 or INT8
  // Of the linear layers' matrices (quantise.h's IsQuantisedLinearName): kF8E4M3 or kI8 when
  // any is held in 8 bits, else matrix_dtype. Part of the model's fingerprint.
  DType linear_dtype = DType::kBF16;
  // Of the output matrix (lm_head, or the tied embedding as the head): kI8 when it is held in
  // 8 bits (LoadWeights' head_format), else matrix_dtype. Part of Transformer::Fingerprint, not
  // of the handshake's identity: the head changes no KV.
  DType head_dtype = DType::kBF16;
  Tensor embed;       // [vocab, hidden], matrix dtype
  Tensor final_norm;  // [hidden] F32
  // [vocab, hidden]; empty when tied (use embed), unless the head is 8-bit: then an INT8 copy
  // of the tied embedding (the embedding stays as it is for the row lookups).
  Tensor lm_head;
  std::vector<LayerWeights> layers;
  std::vector<MtpModule> mtp;  // [config.num_nextn_predict_layers]

  const Tensor& output_matrix() const { return lm_head.empty() ? embed : lm_head; }
  // Bytes of the layer matrices (of an MoE layer, every expert) plus the output matrix: what a
  // plain forward pass reads, so not the MTP modules. An untied embedding is only gathered row
  // by row, so it is not counted.
  size_t MatrixBytes() const;
};

// Loads and converts every tensor the config needs from a model directory. Errors name the
// file and tensor: missing tensor, wrong shape, unsupported dtype, truncated file.
// Tensor names follow Hugging Face ("model.layers.N.self_attn.q_proj.weight", ...).
// matrix_dtype: what the matrices are held in, F32 or BF16 (F16 is refused: no kernel reads it);
// nullopt lets the checkpoint decide (F32 checkpoints stay F32, F16/BF16 ones become BF16).
// FP8 checkpoints (config.quantization): with nullopt, the matrices stored as F8_E4M3 stay FP8
// in memory, with their `weight_scale_inv` as row scales (the others follow the rule above; an
// embedding is dequantised, since it is read row by row); with F32 or BF16 they are dequantised
// exactly (fp8 * scale in F32, then rounded to BF16 for BF16). Errors also name: an F8_E4M3
// tensor in a checkpoint without quantization_config, a missing `weight_scale_inv`, a scale
// shape other than the config's blocks give, an FP8 NaN byte in a matrix kept FP8, column
// blocks the FP8 kernels cannot keep (not a multiple of 128).
// With config.num_nextn_predict_layers > 0 every tensor of each MTP module is required (a
// missing one is named); an MTP embed_tokens copy that differs from the model's is refused.
//
// `linear_format` (`--weights`; nullopt: the checkpoint's own): kBF16 holds every matrix in BF16
// (as matrix_dtype BF16); kF8E4M3 or kI8 holds the linear layers' matrices (quantise.h's policy:
// not the embedding, the lm_head, the MoE router) in that format, quantised at load by
// model/quantise.h from the checkpoint's values in F32 (an 8-bit checkpoint of the same format
// is kept as it is; one of the other format is dequantised first), and the other matrices in
// matrix_dtype, BF16 by default. INT8 checkpoints (quantization_config int8): their I8 matrices
// stay INT8 unless another format or matrix_dtype is asked for.
//
// `head_format` (`--lm-head`) holds the output matrix: nullopt (auto) in INT8 when the linear
// layers are held in 8 bits (either format), else as the other matrices; kBF16 always as the
// other matrices (matrix_dtype); kI8 always in INT8. INT8 is quantise.h's QuantiseInt8Rows (a
// scale per vocabulary row and 128 columns) from the checkpoint's values; a tied embedding then
// stays whole in matrix_dtype for the row lookups and lm_head holds its INT8 copy.
Result<ModelWeights> LoadWeights(const ModelConfig& config, const std::string& model_dir,
                                 std::optional<DType> matrix_dtype = std::nullopt,
                                 std::optional<DType> linear_format = std::nullopt,
                                 std::optional<DType> head_format = std::nullopt);

}  // namespace pdserve
