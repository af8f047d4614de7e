// ModelConfig: the architecture hyper-parameters read from a Hugging Face config.json.
// Plain value type; thread-compatible.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace pdserve {

enum class Architecture : uint8_t {
  kLlama,
  kQwen2,
  kQwen3,
  kMistral,
  kQwen3Moe,
  kDeepseekV2,
  kDeepseekV3
};

// rope_scaling from config.json. "llama3" rescales the low frequencies (Llama 3.1+); "linear"
// divides every position by `factor`; "yarn" (DeepSeek) blends interpolated and original
// frequencies between the beta_fast and beta_slow rotation counts and scales cos/sin and the
// softmax by its mscale terms; "default"/absent is none. Other types are rejected.
struct RopeScaling {
  enum class Type : uint8_t { kNone, kLlama3, kLinear, kYarn } type = Type::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_position_embeddings = 8192;
  double beta_fast = 32.0;  // yarn
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
};

// Multi-head latent attention (DeepSeek-V2/V3): queries through a low-rank q_a/q_b pair (or a
// plain q_proj when q_lora_rank is 0); keys and values from one latent per token, c_kv
// (kv_lora_rank values, normed) plus k_pe (qk_rope_head_dim values, RoPE in DeepSeek's
// adjacent-pair convention), expanded per head by kv_b_proj into k_nope and v.
struct MlaConfig {
  int q_lora_rank = 0;  // 0: q_proj
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  int q_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int latent_dim() const { return kv_lora_rank + qk_rope_head_dim; }
};

// A mixture-of-experts feed-forward (Qwen3-MoE, DeepSeek-V2/V3): in an MoE layer the MLP is
// `num_experts` SwiGLU experts of `expert_intermediate` columns each; a router scores the
// experts for each token (softmax or sigmoid of its logits), picks `experts_per_token` of them
// (the best scores, or the best within the best groups), and sums their outputs weighted by
// their scores (renormalised to sum 1 when norm_topk_prob, times routed_scaling_factor), plus
// the shared experts (always on, weight 1) where the model has them.
struct MoeConfig {
  enum class Scoring : uint8_t { kSoftmax, kSigmoid };
  enum class TopK : uint8_t { kGreedy, kGroupLimitedGreedy, kNoAuxTc };
  int num_experts = 0;          // num_experts / n_routed_experts; 0: every layer is dense
  int experts_per_token = 0;    // num_experts_per_tok
  int expert_intermediate = 0;  // moe_intermediate_size
  bool norm_topk_prob = false;
  int sparse_step = 1;            // Qwen3 decoder_sparse_step: MoE if (i + 1) % step == 0
  std::vector<int> dense_layers;  // Qwen3 mlp_only_layers: dense whatever the step
  int first_dense = 0;            // DeepSeek first_k_dense_replace: layers before it are dense
  int layer_freq = 1;             // DeepSeek moe_layer_freq: MoE if i % freq == 0
  int shared_experts = 0;         // DeepSeek n_shared_experts
  Scoring scoring = Scoring::kSoftmax;
  TopK topk_method = TopK::kGreedy;
  int n_group = 1;  // group-limited choice: keep the topk_group best of n_group groups
  int topk_group = 1;
  double routed_scaling_factor = 1.0;
  // DeepSeek-V2 scales by routed_scaling_factor only the weights it does not renormalise; V3
  // (and Qwen3-MoE, whose factor is 1) scale them either way.
  bool scale_only_unnormalised = false;
};

// The factor YaRN puts on cos and sin (mscale(factor, mscale) / mscale(factor, mscale_all_dim));
// 1 for other scalings.
double RopeAttentionFactor(const RopeScaling& rs);

// quantization_config from config.json: how the checkpoint stores its linear layers' weights.
// DeepSeek's FP8 (quant_method "fp8", fmt "e4m3"): each such matrix is float8_e4m3fn with an
// F32 `weight_scale_inv` per block of block_rows x block_cols (weight_block_size), the real
// weight being the FP8 value times its block's scale. pdserve's INT8 (quant_method "int8",
// what `make-model --dtype int8` writes): each such matrix is I8 (symmetric, no zero point)
// with an F32 `weight_scale` per block, weight_block_size [1, 128] (a scale per row and
// 128-wide block of columns). Other methods are refused by FromJson, naming them.
struct QuantizationConfig {
  enum class Method : uint8_t { kNone, kFp8, kInt8 } method = Method::kNone;
  int block_rows = 0;  // weight_block_size[0]: along the output features
  int block_cols = 0;  // weight_block_size[1]: along the input features
  bool fp8() const { return method == Method::kFp8; }
  bool int8() const { return method == Method::kInt8; }
};

struct ModelConfig {
  Architecture arch = Architecture::kLlama;
  std::string architecture_name;  // as in config.json, e.g. "Qwen2ForCausalLM"
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;  // config's head_dim or hidden_size / num_heads
  int vocab_size = 0;
  int max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  // Qwen2: q/k/v projections carry a bias. (attention_bias: true on the other architectures
  // would also bias o_proj, which the engine does not implement: such configs are rejected.)
  bool qkv_bias = false;
  bool qk_norm = false;               // Qwen3: RMSNorm over each head of q and k before RoPE
  std::optional<int> sliding_window;  // Mistral; contexts are capped to it
  std::optional<int> bos_token_id;
  std::vector<int> eos_token_ids;   // int or list in config.json / generation_config.json
  std::string torch_dtype;          // informational
  MoeConfig moe;                    // Qwen3-MoE, DeepSeek; num_experts 0 elsewhere
  QuantizationConfig quantization;  // kNone for checkpoints of plain BF16/F16/F32 weights
  // DeepSeek: kv_lora_rank > 0. Then num_kv_heads is 1 (the latent, which every TP rank holds
  // whole) and head_dim is the latent's width, kv_lora_rank + qk_rope_head_dim: the cache row.
  MlaConfig mla;
  // DeepSeek-V3's multi-token-prediction modules (num_nextn_predict_layers), stored after the
  // last decoder layer as model.layers.{num_layers + i}.*: loaded and kept for speculative
  // decoding, never run by the plain forward pass, so not part of the fingerprint. 0 elsewhere.
  int num_nextn_predict_layers = 0;

  bool is_mla() const { return mla.kv_lora_rank > 0; }
  // Dimensions RoPE rotates per head: head_dim, or MLA's qk_rope_head_dim.
  int rotary_dim() const { return is_mla() ? mla.qk_rope_head_dim : head_dim; }
  // The attention's softmax scale: 1/sqrt(head_dim), or MLA's 1/sqrt(q_head_dim) times YaRN's
  // mscale(factor, mscale_all_dim) squared.
  double softmax_scale() const;

  // Whether layer `layer`'s feed-forward is the experts (else the dense MLP of
  // intermediate_size).
  bool IsMoeLayer(int layer) const;

  // Parses config.json text. Unsupported architectures and missing or inconsistent fields
  // are InvalidArgument errors that name the field. Absent optional fields take the
  // Hugging Face defaults of the architecture.
  static Result<ModelConfig> FromJson(const std::string& json_text);
  // Reads DIR/config.json (and eos ids from DIR/generation_config.json where present, added to
  // those of config.json). Errors name the file.
  static Result<ModelConfig> Load(const std::string& model_dir);

  // Writes config.json text in the Hugging Face format (for the synthetic model writer).
  std::string ToJson() const;

  // Checks the invariants FromJson guarantees (positive sizes, heads % kv_heads == 0, even
  // head_dim, ...), for configs built in code. InvalidArgument naming the field.
  Status Validate() const;
  Status ValidateMlaAndMoe() const;  // the expert fields (part of Validate)

  // A stable 64-bit hash (FNV-1a) of every field that changes the forward pass (for
  // handshakes). Independent of the weights' values: two seeds of a preset hash the same.
  uint64_t Fingerprint() const;

  // Largest context the engine accepts.
  int MaxContext() const {
    return sliding_window ? std::min(*sliding_window, max_position_embeddings)
                          : max_position_embeddings;
  }
};

}  // namespace pdserve
