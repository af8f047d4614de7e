// The synthetic presets' configs (model/synthetic.h): small models of every architecture the
// engine runs, then real shapes.
#include <string>
#include <vector>

#include "model/synthetic.h"

namespace pdserve {
namespace {

ModelConfig BaseConfig(Architecture arch, const char* name, int hidden, int layers, int heads,
                       int kv_heads, int head_dim, int intermediate, int vocab, bool tied) {
  ModelConfig c;
  c.arch = arch;
  c.architecture_name = name;
  c.hidden_size = hidden;
  c.num_layers = layers;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.intermediate_size = intermediate;
  c.vocab_size = vocab;
  c.tie_word_embeddings = tied;
  c.qkv_bias = arch == Architecture::kQwen2;
  c.qk_norm = arch == Architecture::kQwen3 || arch == Architecture::kQwen3Moe;
  c.max_position_embeddings = 4096;
  c.rms_norm_eps = 1e-5;
  return c;
}

RopeScaling Llama3Scaling(double factor) {
  RopeScaling r;
  r.type = RopeScaling::Type::kLlama3;
  r.factor = factor;
  r.low_freq_factor = 1.0;
  r.high_freq_factor = 4.0;
  r.original_max_position_embeddings = 8192;
  return r;
}

// A tiny DeepSeek: MLA of 4 heads over a 64 + 16 latent, YaRN (factor 4 over an original
// context of 256), 3 layers; the caller sets the experts.
ModelConfig DeepseekConfig(Architecture arch, const char* name) {
  ModelConfig c = BaseConfig(arch, name, 128, 3, 4, 1, 80, 256, 1024, false);
  c.mla.kv_lora_rank = 64;
  c.mla.qk_nope_head_dim = 32;
  c.mla.qk_rope_head_dim = 16;
  c.mla.v_head_dim = 32;
  c.max_position_embeddings = 1024;
  c.rms_norm_eps = 1e-6;
  c.rope_scaling.type = RopeScaling::Type::kYarn;
  c.rope_scaling.factor = 4.0;
  c.rope_scaling.original_max_position_embeddings = 256;
  c.rope_scaling.mscale = 1.0;
  c.rope_scaling.mscale_all_dim = 1.0;
  return c;
}

std::vector<SyntheticPreset> MakePresets() {
  std::vector<SyntheticPreset> p;
  constexpr auto kLlama = Architecture::kLlama;
  constexpr auto kQwen2 = Architecture::kQwen2;
  constexpr auto kQwen3 = Architecture::kQwen3;
  {
    ModelConfig c = BaseConfig(kLlama, "LlamaForCausalLM", 256, 4, 8, 4, 32, 688, 2048, true);
    p.push_back({"tiny", "Llama, 3.4M params, tied; the embedded default", c});
  }
  {
    ModelConfig c = BaseConfig(kQwen2, "Qwen2ForCausalLM", 128, 3, 4, 2, 32, 352, 1024, true);
    c.rope_theta = 1e6;
    c.rms_norm_eps = 1e-6;
    p.push_back({"tiny-qwen2", "Qwen2 (q/k/v bias), 2 KV heads, tied", c});
  }
  {
    // head_dim 48 != hidden / heads: exercises the explicit head_dim path.
    ModelConfig c = BaseConfig(kQwen3, "Qwen3ForCausalLM", 128, 3, 4, 2, 48, 384, 1024, true);
    c.rope_theta = 1e6;
    c.rms_norm_eps = 1e-6;
    p.push_back({"tiny-qwen3", "Qwen3 (q/k RMSNorm), head_dim 48 != hidden/heads", c});
  }
  {
    ModelConfig c = BaseConfig(Architecture::kMistral, "MistralForCausalLM", 128, 3, 8, 2, 16, 320,
                               1024, false);
    c.sliding_window = 1024;
    p.push_back({"tiny-mistral", "Mistral, sliding window 1024, untied lm_head", c});
  }
  {
    ModelConfig c = BaseConfig(kLlama, "LlamaForCausalLM", 128, 3, 4, 1, 32, 384, 1536, false);
    c.rope_theta = 500000.0;
    c.rope_scaling = Llama3Scaling(8.0);
    c.max_position_embeddings = 16384;
    p.push_back({"tiny-llama3", "Llama 3 rope scaling, 1 KV head, untied lm_head", c});
  }
  {
    // Every Qwen3-MoE feature: a dense layer among the MoE ones (mlp_only_layers), renormalised
    // top-k, an untied lm_head; 128 expert columns split in whole 64-column blocks under TP 2.
    ModelConfig c = BaseConfig(Architecture::kQwen3Moe, "Qwen3MoeForCausalLM", 128, 4, 4, 2, 48,
                               256, 1024, false);
    c.rope_theta = 1e6;
    c.rms_norm_eps = 1e-6;
    c.moe.num_experts = 8;
    c.moe.experts_per_token = 2;
    c.moe.expert_intermediate = 128;
    c.moe.norm_topk_prob = true;
    c.moe.sparse_step = 1;
    c.moe.dense_layers = {2};
    p.push_back({"qwen3-moe-tiny", "Qwen3-MoE, 8 experts top 2, layer 2 dense, untied lm_head", c});
  }
  {
    // DeepSeek-V3's features: q_lora, noaux_tc routing over sigmoid scores in groups with the
    // correction bias, a shared expert, a dense first layer, YaRN with the softmax mscale, and
    // an MTP layer in the checkpoint (not run by the forward pass).
    ModelConfig c = DeepseekConfig(Architecture::kDeepseekV3, "DeepseekV3ForCausalLM");
    c.mla.q_lora_rank = 96;
    c.moe.num_experts = 16;
    c.moe.experts_per_token = 4;
    c.moe.expert_intermediate = 64;
    c.moe.norm_topk_prob = true;
    c.moe.first_dense = 1;
    c.moe.shared_experts = 1;
    c.moe.scoring = MoeConfig::Scoring::kSigmoid;
    c.moe.topk_method = MoeConfig::TopK::kNoAuxTc;
    c.moe.n_group = 4;
    c.moe.topk_group = 2;
    c.moe.routed_scaling_factor = 2.5;
    c.num_nextn_predict_layers = 1;
    p.push_back({"deepseek-v3-tiny",
                 "DeepSeek-V3 (MLA with q_lora, noaux_tc groups, shared expert, YaRN, MTP layer)",
                 c});
  }
  {
    // DeepSeek-V2-Lite's features: a plain q_proj, greedy softmax routing without
    // renormalisation, two shared experts.
    ModelConfig c = DeepseekConfig(Architecture::kDeepseekV2, "DeepseekV2ForCausalLM");
    c.rope_scaling.mscale = 0.707;
    c.rope_scaling.mscale_all_dim = 0.707;
    c.moe.num_experts = 8;
    c.moe.experts_per_token = 2;
    c.moe.expert_intermediate = 64;
    c.moe.norm_topk_prob = false;
    c.moe.first_dense = 1;
    c.moe.shared_experts = 2;
    c.moe.routed_scaling_factor = 1.0;
    c.moe.scale_only_unnormalised = true;
    p.push_back({"deepseek-v2-lite-tiny",
                 "DeepSeek-V2-Lite (MLA with q_proj, greedy softmax routing, 2 shared experts)",
                 c});
  }
  {
    ModelConfig c = BaseConfig(kQwen2, "Qwen2ForCausalLM", 896, 24, 14, 2, 64, 4864, 151936, true);
    c.rope_theta = 1e6;
    c.rms_norm_eps = 1e-6;
    c.max_position_embeddings = 32768;
    p.push_back({"qwen2.5-0.5b", "Qwen2.5-0.5B shape (494M params)", c});
  }
  {
    ModelConfig c = BaseConfig(kLlama, "LlamaForCausalLM", 2048, 16, 32, 8, 64, 8192, 128256, true);
    c.rope_theta = 500000.0;
    c.rope_scaling = Llama3Scaling(32.0);
    c.max_position_embeddings = 131072;
    p.push_back({"llama-3.2-1b", "Llama-3.2-1B shape (1.24B params)", c});
  }
  {
    // Qwen3-30B-A3B's layers with all 128 experts, 4 of its 48 layers: 1.21 GB of experts a
    // layer in BF16; a decode token reads 8 of them (75 MB a layer).
    ModelConfig c = BaseConfig(Architecture::kQwen3Moe, "Qwen3MoeForCausalLM", 2048, 4, 32, 4, 128,
                               6144, 151936, false);
    c.rope_theta = 1e6;
    c.rms_norm_eps = 1e-6;
    c.max_position_embeddings = 40960;
    c.moe.num_experts = 128;
    c.moe.experts_per_token = 8;
    c.moe.expert_intermediate = 768;
    c.moe.norm_topk_prob = true;
    c.moe.sparse_step = 1;
    c.moe.dense_layers = {};
    p.push_back({"qwen3-30b-a3b-4l",
                 "Qwen3-30B-A3B's layer shapes, 128 experts, 4 of 48 layers (3.1B params)", c});
  }
  {
    // DeepSeek-V2-Lite's layers as shipped, all 64 experts, 4 of its 27 layers: MLA with a plain
    // q_proj over a 512 + 64 latent, 16 heads; a dense first layer (10944 columns), then 64
    // experts of 1408 columns, 6 chosen per token by greedy softmax without renormalisation,
    // plus 2 shared experts; YaRN as V2-Lite's config.json sets it. 554 MB of experts a layer in
    // BF16; a decode token reads 6 of them (52 MB a layer).
    ModelConfig c = BaseConfig(Architecture::kDeepseekV2, "DeepseekV2ForCausalLM", 2048, 4, 16, 1,
                               576, 10944, 102400, false);
    c.mla.q_lora_rank = 0;
    c.mla.kv_lora_rank = 512;
    c.mla.qk_nope_head_dim = 128;
    c.mla.qk_rope_head_dim = 64;
    c.mla.v_head_dim = 128;
    c.max_position_embeddings = 163840;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 10000.0;
    c.rope_scaling.type = RopeScaling::Type::kYarn;
    c.rope_scaling.factor = 40.0;
    c.rope_scaling.original_max_position_embeddings = 4096;
    c.rope_scaling.beta_fast = 32.0;
    c.rope_scaling.beta_slow = 1.0;
    c.rope_scaling.mscale = 0.707;
    c.rope_scaling.mscale_all_dim = 0.707;
    c.moe.num_experts = 64;
    c.moe.experts_per_token = 6;
    c.moe.expert_intermediate = 1408;
    c.moe.norm_topk_prob = false;
    c.moe.first_dense = 1;
    c.moe.layer_freq = 1;
    c.moe.shared_experts = 2;
    c.moe.scoring = MoeConfig::Scoring::kSoftmax;
    c.moe.topk_method = MoeConfig::TopK::kGreedy;
    c.moe.routed_scaling_factor = 1.0;
    c.moe.scale_only_unnormalised = true;
    p.push_back({"deepseek-v2-lite-4l",
                 "DeepSeek-V2-Lite's layer shapes, 64 experts, 4 of 27 layers (2.3B params)", c});
  }
  return p;
}

}  // namespace

const std::vector<SyntheticPreset>& SyntheticPresets() {
  static const std::vector<SyntheticPreset> presets = MakePresets();
  return presets;
}

std::vector<std::string> SyntheticPresetNames() {
  std::vector<std::string> names;
  for (const SyntheticPreset& p : SyntheticPresets()) names.push_back(p.name);
  return names;
}

Result<ModelConfig> SyntheticPresetConfig(const std::string& name) {
  for (const SyntheticPreset& p : SyntheticPresets()) {
    if (p.name == name) return p.config;
  }
  std::string known;
  for (const std::string& n : SyntheticPresetNames()) known += (known.empty() ? "" : ", ") + n;
  return Status::NotFound("unknown synthetic preset '" + name + "'; known: " + known);
}

}  // namespace pdserve
