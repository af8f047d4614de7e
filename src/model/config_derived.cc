// What a ModelConfig's fields imply, apart from reading and writing config.json (config.cc):
// which layers are MoE, the attention's scales, and the fingerprint peers compare.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "model/config.h"

namespace pdserve {

bool ModelConfig::IsMoeLayer(int layer) const {
  // Qwen3MoeDecoderLayer: experts unless listed in mlp_only_layers, every sparse_step-th layer;
  // DeepSeek: from first_k_dense_replace on, every moe_layer_freq-th layer.
  return moe.num_experts > 0 && layer >= moe.first_dense && layer % moe.layer_freq == 0 &&
         (layer + 1) % moe.sparse_step == 0 &&
         std::find(moe.dense_layers.begin(), moe.dense_layers.end(), layer) ==
             moe.dense_layers.end();
}

namespace {
// YaRN's attention temperature (DeepSeek's yarn_get_mscale).
double YarnMscale(double factor, double mscale) {
  return factor <= 1 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}
}  // namespace

double ModelConfig::softmax_scale() const {
  if (!is_mla()) return 1.0 / std::sqrt(static_cast<double>(head_dim));
  double scale = 1.0 / std::sqrt(static_cast<double>(mla.q_head_dim()));
  if (rope_scaling.type == RopeScaling::Type::kYarn && rope_scaling.mscale_all_dim != 0) {
    const double m = YarnMscale(rope_scaling.factor, rope_scaling.mscale_all_dim);
    scale *= m * m;
  }
  return scale;
}

double RopeAttentionFactor(const RopeScaling& rs) {
  if (rs.type != RopeScaling::Type::kYarn) return 1.0;
  return YarnMscale(rs.factor, rs.mscale) / YarnMscale(rs.factor, rs.mscale_all_dim);
}

uint64_t ModelConfig::Fingerprint() const {
  // Canonical text of the forward-relevant fields; %.17g round-trips doubles exactly.
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "arch=%d hidden=%d inter=%d layers=%d heads=%d kv=%d hd=%d vocab=%d eps=%.17g "
                "theta=%.17g rs=%d/%.17g/%.17g/%.17g/%d tie=%d bias=%d qknorm=%d window=%d",
                static_cast<int>(arch), hidden_size, intermediate_size, num_layers, num_heads,
                num_kv_heads, head_dim, vocab_size, rms_norm_eps, rope_theta,
                static_cast<int>(rope_scaling.type), rope_scaling.factor,
                rope_scaling.low_freq_factor, rope_scaling.high_freq_factor,
                rope_scaling.original_max_position_embeddings, tie_word_embeddings ? 1 : 0,
                qkv_bias ? 1 : 0, qk_norm ? 1 : 0, sliding_window.value_or(0));
  std::string text = buf;
  if (moe.num_experts > 0) {  // appended only for MoE models: dense fingerprints stay as they were
    text += " moe=" + std::to_string(moe.num_experts) + "/" +
            std::to_string(moe.experts_per_token) + "/" + std::to_string(moe.expert_intermediate) +
            "/" + std::to_string(moe.norm_topk_prob ? 1 : 0) + "/" +
            std::to_string(moe.sparse_step) + "/";
    for (int layer : moe.dense_layers) text += std::to_string(layer) + ",";
    char more[256];
    std::snprintf(more, sizeof(more),
                  " first=%d freq=%d shared=%d score=%d topk=%d group=%d/%d "
                  "scale=%.17g/%d",
                  moe.first_dense, moe.layer_freq, moe.shared_experts,
                  static_cast<int>(moe.scoring), static_cast<int>(moe.topk_method), moe.n_group,
                  moe.topk_group, moe.routed_scaling_factor, moe.scale_only_unnormalised ? 1 : 0);
    text += more;
  }
  if (is_mla()) {
    text += " mla=" + std::to_string(mla.q_lora_rank) + "/" + std::to_string(mla.kv_lora_rank) +
            "/" + std::to_string(mla.qk_nope_head_dim) + "/" +
            std::to_string(mla.qk_rope_head_dim) + "/" + std::to_string(mla.v_head_dim);
  }
  if (rope_scaling.type == RopeScaling::Type::kYarn) {
    char yarn[160];
    std::snprintf(yarn, sizeof(yarn), " yarn=%.17g/%.17g/%.17g/%.17g", rope_scaling.beta_fast,
                  rope_scaling.beta_slow, rope_scaling.mscale, rope_scaling.mscale_all_dim);
    text += yarn;
  }
  if (quantization.fp8()) {  // appended only when quantised, as the experts above
    text += " fp8=" + std::to_string(quantization.block_rows) + "x" +
            std::to_string(quantization.block_cols);
  } else if (quantization.int8()) {
    text += " int8=" + std::to_string(quantization.block_rows) + "x" +
            std::to_string(quantization.block_cols);
  }
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a offset basis
  for (const char* p = text.c_str(); *p != '\0'; ++p) {
    h ^= static_cast<unsigned char>(*p);
    h *= 0x100000001b3ull;  // FNV prime
  }
  return h;
}

}  // namespace pdserve
