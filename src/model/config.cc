#include "model/config.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

namespace pdserve {
namespace {

using json = nlohmann::json;

struct ArchInfo {
  Architecture arch;
  const char* name;        // "architectures" entry
  const char* model_type;  // "model_type"
};

constexpr ArchInfo kArchitectures[] = {
    {Architecture::kLlama, "LlamaForCausalLM", "llama"},
    {Architecture::kQwen2, "Qwen2ForCausalLM", "qwen2"},
    {Architecture::kQwen3, "Qwen3ForCausalLM", "qwen3"},
    {Architecture::kMistral, "MistralForCausalLM", "mistral"},
    {Architecture::kQwen3Moe, "Qwen3MoeForCausalLM", "qwen3_moe"},
    {Architecture::kDeepseekV2, "DeepseekV2ForCausalLM", "deepseek_v2"},
    {Architecture::kDeepseekV3, "DeepseekV3ForCausalLM", "deepseek_v3"},
};

bool IsDeepseek(Architecture a) {
  return a == Architecture::kDeepseekV2 || a == Architecture::kDeepseekV3;
}

// Upper bounds that no real model reaches; they keep shape products far from overflow.
constexpr int kMaxDim = 1 << 20;
constexpr int kMaxLayers = 1024;
constexpr int kMaxVocab = 1 << 24;

std::string SupportedList() {
  std::string s;
  for (const ArchInfo& a : kArchitectures) {
    if (!s.empty()) s += ", ";
    s += a.name;
  }
  return s;
}

const ArchInfo& InfoOf(Architecture arch) {
  for (const ArchInfo& a : kArchitectures) {
    if (a.arch == arch) return a;
  }
  return kArchitectures[0];
}

Status FieldError(std::string_view key, std::string_view expected, const json& value) {
  return Status::InvalidArgument("config.json: '" + std::string(key) + "' must be " +
                                 std::string(expected) + ", got " + value.dump());
}

// Reads obj[key] when present and not null; leaves *out unset otherwise.
Status ReadInt(const json& obj, std::string_view key, std::optional<int>* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return Status::Ok();
  if (!it->is_number_integer()) return FieldError(key, "an integer", *it);
  int64_t v = it->is_number_unsigned()
                  ? static_cast<int64_t>(std::min<uint64_t>(it->get<uint64_t>(), uint64_t{1} << 40))
                  : it->get<int64_t>();
  if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
    return FieldError(key, "a 32-bit integer", *it);
  }
  *out = static_cast<int>(v);
  return Status::Ok();
}

Status ReadDouble(const json& obj, std::string_view key, std::optional<double>* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return Status::Ok();
  if (!it->is_number()) return FieldError(key, "a number", *it);
  *out = it->get<double>();
  return Status::Ok();
}

Status ReadBool(const json& obj, std::string_view key, std::optional<bool>* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return Status::Ok();
  if (!it->is_boolean()) return FieldError(key, "true or false", *it);
  *out = it->get<bool>();
  return Status::Ok();
}

Status RequireInt(const json& obj, std::string_view key, int* out) {
  std::optional<int> v;
  PD_RETURN_IF_ERROR(ReadInt(obj, key, &v));
  if (!v) return Status::InvalidArgument("config.json: missing field '" + std::string(key) + "'");
  *out = *v;
  return Status::Ok();
}

// eos_token_id is an integer or a list of integers (Llama 3 instruct lists several).
Status ReadTokenIds(const json& obj, std::string_view key, std::vector<int>* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return Status::Ok();
  if (it->is_number_integer()) {
    std::optional<int> v;
    PD_RETURN_IF_ERROR(ReadInt(obj, key, &v));
    out->push_back(*v);
    return Status::Ok();
  }
  if (!it->is_array()) return FieldError(key, "an integer or a list of integers", *it);
  for (const json& e : *it) {
    if (!e.is_number_integer() || e.get<int64_t>() < 0 ||
        e.get<int64_t>() > std::numeric_limits<int>::max()) {
      return FieldError(key, "an integer or a list of integers", *it);
    }
    out->push_back(e.get<int>());
  }
  return Status::Ok();
}

Result<const ArchInfo*> ParseArchitecture(const json& j) {
  auto it = j.find("architectures");
  if (it != j.end() && !it->is_null()) {
    if (!it->is_array() || it->empty() || !(*it)[0].is_string()) {
      return FieldError("architectures", "a non-empty list of strings", *it);
    }
    std::string name = (*it)[0].get<std::string>();
    for (const ArchInfo& a : kArchitectures) {
      if (name == a.name) return &a;
    }
    return Status::InvalidArgument("config.json: unsupported architecture '" + name +
                                   "'; supported: " + SupportedList());
  }
  // Some exported configs carry only model_type.
  auto mt = j.find("model_type");
  if (mt == j.end() || !mt->is_string()) {
    return Status::InvalidArgument(
        "config.json: missing field 'architectures' (and no 'model_type'); supported: " +
        SupportedList());
  }
  std::string type = mt->get<std::string>();
  for (const ArchInfo& a : kArchitectures) {
    if (type == a.model_type) return &a;
  }
  return Status::InvalidArgument("config.json: unsupported model_type '" + type +
                                 "'; supported: " + SupportedList());
}

// rope_scaling, or rope_parameters as newer transformers releases write it (same keys, plus
// rope_theta).
Status ParseRopeScaling(const json& j, RopeScaling* out) {
  std::string key = "rope_scaling";
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    key = "rope_parameters";
    it = j.find(key);
  }
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_object()) return FieldError(key, "an object or null", *it);
  const json& rs = *it;
  std::string type;
  for (const char* key : {"rope_type", "type"}) {
    auto t = rs.find(key);
    if (t != rs.end() && t->is_string()) {
      type = t->get<std::string>();
      break;
    }
  }
  if (type.empty() || type == "default") return Status::Ok();
  std::optional<double> factor;
  PD_RETURN_IF_ERROR(ReadDouble(rs, "factor", &factor));
  if (!factor) return Status::InvalidArgument("config.json: " + key + " is missing 'factor'");
  out->factor = *factor;
  if (type == "linear") {
    out->type = RopeScaling::Type::kLinear;
    return Status::Ok();
  }
  if (type == "yarn") {
    out->type = RopeScaling::Type::kYarn;
    std::optional<double> beta_fast, beta_slow, mscale, mscale_all_dim;
    std::optional<int> original;
    PD_RETURN_IF_ERROR(ReadDouble(rs, "beta_fast", &beta_fast));
    PD_RETURN_IF_ERROR(ReadDouble(rs, "beta_slow", &beta_slow));
    PD_RETURN_IF_ERROR(ReadDouble(rs, "mscale", &mscale));
    PD_RETURN_IF_ERROR(ReadDouble(rs, "mscale_all_dim", &mscale_all_dim));
    PD_RETURN_IF_ERROR(ReadInt(rs, "original_max_position_embeddings", &original));
    if (!original) {
      return Status::InvalidArgument("config.json: yarn " + key +
                                     " needs 'original_max_position_embeddings'");
    }
    // DeepSeek's YaRN defaults (modeling_deepseek.py).
    out->beta_fast = beta_fast.value_or(32.0);
    out->beta_slow = beta_slow.value_or(1.0);
    out->mscale = mscale.value_or(1.0);
    out->mscale_all_dim = mscale_all_dim.value_or(0.0);
    out->original_max_position_embeddings = *original;
    return Status::Ok();
  }
  if (type != "llama3") {
    return Status::InvalidArgument("config.json: unsupported " + key + " type '" + type +
                                   "'; supported: default, linear, llama3, yarn");
  }
  out->type = RopeScaling::Type::kLlama3;
  std::optional<double> low, high;
  std::optional<int> original;
  PD_RETURN_IF_ERROR(ReadDouble(rs, "low_freq_factor", &low));
  PD_RETURN_IF_ERROR(ReadDouble(rs, "high_freq_factor", &high));
  PD_RETURN_IF_ERROR(ReadInt(rs, "original_max_position_embeddings", &original));
  if (!low || !high || !original) {
    return Status::InvalidArgument("config.json: llama3 " + key +
                                   " needs 'low_freq_factor', 'high_freq_factor' and "
                                   "'original_max_position_embeddings'");
  }
  out->low_freq_factor = *low;
  out->high_freq_factor = *high;
  out->original_max_position_embeddings = *original;
  return Status::Ok();
}

// Fields whose presence would change the forward pass in ways the engine does not implement.
Status RejectUnsupportedFeatures(const json& j, const ModelConfig& c) {
  auto act = j.find("hidden_act");
  if (act != j.end() && !act->is_null() && *act != "silu") {
    return Status::InvalidArgument("config.json: hidden_act " + act->dump() +
                                   " is not supported (only \"silu\")");
  }
  std::optional<bool> mlp_bias, attention_bias;
  PD_RETURN_IF_ERROR(ReadBool(j, "mlp_bias", &mlp_bias));
  PD_RETURN_IF_ERROR(ReadBool(j, "attention_bias", &attention_bias));
  if (mlp_bias.value_or(false)) {
    return Status::InvalidArgument("config.json: mlp_bias: true is not supported");
  }
  if (c.arch != Architecture::kQwen2 && attention_bias.value_or(false)) {
    return Status::InvalidArgument("config.json: attention_bias: true is not supported for " +
                                   c.architecture_name + " (it adds an o_proj bias)");
  }
  return Status::Ok();
}

Status ParseSizes(const json& j, ModelConfig* c) {
  PD_RETURN_IF_ERROR(RequireInt(j, "hidden_size", &c->hidden_size));
  PD_RETURN_IF_ERROR(RequireInt(j, "intermediate_size", &c->intermediate_size));
  PD_RETURN_IF_ERROR(RequireInt(j, "num_hidden_layers", &c->num_layers));
  PD_RETURN_IF_ERROR(RequireInt(j, "num_attention_heads", &c->num_heads));
  PD_RETURN_IF_ERROR(RequireInt(j, "vocab_size", &c->vocab_size));
  std::optional<int> kv_heads, head_dim, max_pos;
  PD_RETURN_IF_ERROR(ReadInt(j, "num_key_value_heads", &kv_heads));
  PD_RETURN_IF_ERROR(ReadInt(j, "head_dim", &head_dim));
  PD_RETURN_IF_ERROR(ReadInt(j, "max_position_embeddings", &max_pos));
  c->num_kv_heads = kv_heads.value_or(c->num_heads);
  if (IsDeepseek(c->arch)) {
    c->head_dim = 0;  // the latent's width: ParseDeepseek
  } else if (head_dim) {
    c->head_dim = *head_dim;
  } else if (c->arch == Architecture::kQwen3) {
    c->head_dim = 128;  // Qwen3Config's default: head_dim is independent of hidden_size
  } else {
    if (c->num_heads <= 0 || c->hidden_size % c->num_heads != 0) {
      return Status::InvalidArgument("config.json: hidden_size " + std::to_string(c->hidden_size) +
                                     " is not divisible by num_attention_heads " +
                                     std::to_string(c->num_heads) + " and no head_dim is given");
    }
    c->head_dim = c->hidden_size / c->num_heads;
  }
  c->max_position_embeddings = max_pos.value_or(c->arch == Architecture::kMistral ? 131072 : 2048);
  return Status::Ok();
}

Status ParseOptionalFields(const json& j, ModelConfig* c) {
  std::optional<double> eps, theta;
  PD_RETURN_IF_ERROR(ReadDouble(j, "rms_norm_eps", &eps));
  PD_RETURN_IF_ERROR(ReadDouble(j, "rope_theta", &theta));
  c->rms_norm_eps = eps.value_or(1e-6);
  auto params = j.find("rope_parameters");
  if (!theta && params != j.end() && params->is_object()) {
    PD_RETURN_IF_ERROR(ReadDouble(*params, "rope_theta", &theta));
  }
  c->rope_theta = theta.value_or(10000.0);
  PD_RETURN_IF_ERROR(ParseRopeScaling(j, &c->rope_scaling));
  std::optional<bool> tie;
  PD_RETURN_IF_ERROR(ReadBool(j, "tie_word_embeddings", &tie));
  c->tie_word_embeddings = tie.value_or(false);
  c->qkv_bias = c->arch == Architecture::kQwen2;
  c->qk_norm = c->arch == Architecture::kQwen3 || c->arch == Architecture::kQwen3Moe;

  std::optional<int> window;
  PD_RETURN_IF_ERROR(ReadInt(j, "sliding_window", &window));
  if (c->arch == Architecture::kMistral) {
    // MistralConfig defaults to 4096 when the key is absent; null means full attention.
    c->sliding_window = j.contains("sliding_window") ? window : std::optional<int>(4096);
  } else if (c->arch != Architecture::kLlama) {
    // Qwen configs always carry a sliding_window, but it applies only with use_sliding_window.
    std::optional<bool> use;
    PD_RETURN_IF_ERROR(ReadBool(j, "use_sliding_window", &use));
    if (use.value_or(false)) c->sliding_window = window;
  }

  std::optional<int> bos;
  PD_RETURN_IF_ERROR(ReadInt(j, "bos_token_id", &bos));
  c->bos_token_id = bos;
  PD_RETURN_IF_ERROR(ReadTokenIds(j, "eos_token_id", &c->eos_token_ids));
  for (const char* key : {"torch_dtype", "dtype"}) {  // newer transformers write "dtype"
    auto dt = j.find(key);
    if (dt != j.end() && dt->is_string()) {
      c->torch_dtype = dt->get<std::string>();
      break;
    }
  }
  return Status::Ok();
}

Status ReadString(const json& obj, std::string_view key, std::optional<std::string>* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return Status::Ok();
  if (!it->is_string()) return FieldError(key, "a string", *it);
  *out = it->get<std::string>();
  return Status::Ok();
}

// DeepSeek-V2/V3's latent attention and expert fields (the config classes' defaults where
// absent: V3's are noaux_tc over sigmoid scores in 8 groups keeping 4, scaled by 2.5, after
// 3 dense layers; V2's greedy over softmax, unscaled).
Status ParseDeepseek(const json& j, ModelConfig* c) {
  const bool v3 = c->arch == Architecture::kDeepseekV3;
  MlaConfig& a = c->mla;
  std::optional<int> q_lora;
  PD_RETURN_IF_ERROR(ReadInt(j, "q_lora_rank", &q_lora));
  a.q_lora_rank = q_lora.value_or(0);
  PD_RETURN_IF_ERROR(RequireInt(j, "kv_lora_rank", &a.kv_lora_rank));
  PD_RETURN_IF_ERROR(RequireInt(j, "qk_nope_head_dim", &a.qk_nope_head_dim));
  PD_RETURN_IF_ERROR(RequireInt(j, "qk_rope_head_dim", &a.qk_rope_head_dim));
  PD_RETURN_IF_ERROR(RequireInt(j, "v_head_dim", &a.v_head_dim));
  c->num_kv_heads = 1;  // the latent
  c->head_dim = a.kv_lora_rank + a.qk_rope_head_dim;
  // Absent: no MTP module. (DeepseekV3Config defaults it to 1, but Hugging Face's model never
  // loads the modules, so a checkpoint exported without the field need not hold them.)
  std::optional<int> mtp;
  PD_RETURN_IF_ERROR(ReadInt(j, "num_nextn_predict_layers", &mtp));
  c->num_nextn_predict_layers = mtp.value_or(0);

  MoeConfig& m = c->moe;
  std::optional<int> experts;
  PD_RETURN_IF_ERROR(ReadInt(j, "n_routed_experts", &experts));
  m.num_experts = experts.value_or(0);
  if (m.num_experts == 0) return Status::Ok();
  PD_RETURN_IF_ERROR(RequireInt(j, "num_experts_per_tok", &m.experts_per_token));
  PD_RETURN_IF_ERROR(RequireInt(j, "moe_intermediate_size", &m.expert_intermediate));
  std::optional<int> shared, groups, topk_group, first_dense, freq;
  std::optional<bool> norm;
  std::optional<double> scaling;
  std::optional<std::string> method, scoring;
  PD_RETURN_IF_ERROR(ReadInt(j, "n_shared_experts", &shared));
  PD_RETURN_IF_ERROR(ReadInt(j, "n_group", &groups));
  PD_RETURN_IF_ERROR(ReadInt(j, "topk_group", &topk_group));
  PD_RETURN_IF_ERROR(ReadInt(j, "first_k_dense_replace", &first_dense));
  PD_RETURN_IF_ERROR(ReadInt(j, "moe_layer_freq", &freq));
  PD_RETURN_IF_ERROR(ReadBool(j, "norm_topk_prob", &norm));
  PD_RETURN_IF_ERROR(ReadDouble(j, "routed_scaling_factor", &scaling));
  PD_RETURN_IF_ERROR(ReadString(j, "topk_method", &method));
  PD_RETURN_IF_ERROR(ReadString(j, "scoring_func", &scoring));
  m.shared_experts = shared.value_or(0);
  m.n_group = groups.value_or(v3 ? 8 : 1);
  m.topk_group = topk_group.value_or(v3 ? 4 : 1);
  m.first_dense = first_dense.value_or(v3 ? 3 : 0);
  m.layer_freq = freq.value_or(1);
  m.norm_topk_prob = norm.value_or(v3);
  m.routed_scaling_factor = scaling.value_or(v3 ? 2.5 : 1.0);
  m.scale_only_unnormalised = !v3;
  const std::string method_name = method.value_or(v3 ? "noaux_tc" : "greedy");
  if (method_name == "greedy" || method_name == "gready") {  // V2's config class spells it so
    m.topk_method = MoeConfig::TopK::kGreedy;
  } else if (method_name == "group_limited_greedy") {
    m.topk_method = MoeConfig::TopK::kGroupLimitedGreedy;
  } else if (method_name == "noaux_tc") {
    m.topk_method = MoeConfig::TopK::kNoAuxTc;
  } else {
    return Status::InvalidArgument("config.json: topk_method '" + method_name +
                                   "' is not supported (greedy, group_limited_greedy, noaux_tc)");
  }
  const std::string scoring_name = scoring.value_or(v3 ? "sigmoid" : "softmax");
  if (scoring_name == "softmax") {
    m.scoring = MoeConfig::Scoring::kSoftmax;
  } else if (scoring_name == "sigmoid") {
    m.scoring = MoeConfig::Scoring::kSigmoid;
  } else {
    return Status::InvalidArgument("config.json: scoring_func '" + scoring_name +
                                   "' is not supported (softmax, sigmoid)");
  }
  return Status::Ok();
}

// Qwen3MoeConfig's expert fields (its defaults where absent, as Hugging Face's config class).
Status ParseMoe(const json& j, ModelConfig* c) {
  if (IsDeepseek(c->arch)) return ParseDeepseek(j, c);
  if (c->arch != Architecture::kQwen3Moe) return Status::Ok();
  MoeConfig& m = c->moe;
  PD_RETURN_IF_ERROR(RequireInt(j, "num_experts", &m.num_experts));
  if (m.num_experts == 0) return Status::Ok();  // HF allows it: every layer dense
  PD_RETURN_IF_ERROR(RequireInt(j, "num_experts_per_tok", &m.experts_per_token));
  PD_RETURN_IF_ERROR(RequireInt(j, "moe_intermediate_size", &m.expert_intermediate));
  std::optional<int> step;
  std::optional<bool> norm;
  PD_RETURN_IF_ERROR(ReadInt(j, "decoder_sparse_step", &step));
  PD_RETURN_IF_ERROR(ReadBool(j, "norm_topk_prob", &norm));
  m.sparse_step = step.value_or(1);
  m.norm_topk_prob = norm.value_or(false);
  auto it = j.find("mlp_only_layers");
  if (it != j.end() && !it->is_null()) {
    if (!it->is_array()) return FieldError("mlp_only_layers", "a list of layer indices", *it);
    for (const json& e : *it) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= kMaxLayers) {
        return FieldError("mlp_only_layers", "a list of layer indices", *it);
      }
      m.dense_layers.push_back(e.get<int>());
    }
  }
  return Status::Ok();
}

// quantization_config: absent or null for plain checkpoints; DeepSeek's FP8 block scaling, or
// an error naming the method (or field) the engine does not implement.
Status ParseQuantization(const json& j, QuantizationConfig* q) {
  auto it = j.find("quantization_config");
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_object()) return FieldError("quantization_config", "an object or null", *it);
  const json& qc = *it;
  auto method = qc.find("quant_method");
  if (method == qc.end() || !method->is_string()) {
    return Status::InvalidArgument(
        "config.json: quantization_config needs 'quant_method' (a string; supported: \"fp8\", "
        "\"int8\")");
  }
  if (*method != "fp8" && *method != "int8") {
    return Status::InvalidArgument("config.json: quantization_config.quant_method " +
                                   method->dump() +
                                   " is not supported (only \"fp8\", DeepSeek's block-scaled "
                                   "float8_e4m3fn weights, and \"int8\", pdserve's block-scaled "
                                   "int8 weights)");
  }
  const bool int8 = *method == "int8";
  auto fmt = qc.find("fmt");
  if (!int8 && fmt != qc.end() && !fmt->is_null() && *fmt != "e4m3") {
    return Status::InvalidArgument("config.json: quantization_config.fmt " + fmt->dump() +
                                   " is not supported (only \"e4m3\")");
  }
  // The engine computes activations in F32 and never quantises them, which serves "dynamic"
  // (scales computed per token at run time); "static" would come with input scales it does not
  // read.
  auto scheme = qc.find("activation_scheme");
  if (scheme != qc.end() && !scheme->is_null() && *scheme != "dynamic") {
    return Status::InvalidArgument("config.json: quantization_config.activation_scheme " +
                                   scheme->dump() + " is not supported (only \"dynamic\")");
  }
  auto block = qc.find("weight_block_size");
  if (block == qc.end() || block->is_null()) {
    return Status::InvalidArgument(
        "config.json: quantization_config needs 'weight_block_size' [rows, columns] "
        "(per-tensor scales are not supported)");
  }
  if (!block->is_array() || block->size() != 2 || !(*block)[0].is_number_integer() ||
      !(*block)[1].is_number_integer() || (*block)[0].get<int64_t>() <= 0 ||
      (*block)[1].get<int64_t>() <= 0 || (*block)[0].get<int64_t>() > kMaxDim ||
      (*block)[1].get<int64_t>() > kMaxDim) {
    return FieldError("quantization_config.weight_block_size", "two positive integers", *block);
  }
  q->method = int8 ? QuantizationConfig::Method::kInt8 : QuantizationConfig::Method::kFp8;
  q->block_rows = (*block)[0].get<int>();
  q->block_cols = (*block)[1].get<int>();
  return Status::Ok();
}

Result<json> ParseJsonText(const std::string& text, const std::string& what) {
  try {
    json j = json::parse(text);
    if (!j.is_object()) return Status::InvalidArgument(what + ": not a JSON object");
    return j;
  } catch (const json::exception& e) {
    return Status::InvalidArgument(what + ": invalid JSON: " + e.what());
  }
}

Result<std::string> ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Status::IoError("cannot read " + path);
  return ss.str();
}

Status Positive(std::string_view field, int64_t v) {
  if (v > 0) return Status::Ok();
  return Status::InvalidArgument("config: '" + std::string(field) + "' must be positive, got " +
                                 std::to_string(v));
}

Status AtMost(std::string_view field, int64_t v, int64_t limit) {
  if (v <= limit) return Status::Ok();
  return Status::InvalidArgument("config: '" + std::string(field) + "' = " + std::to_string(v) +
                                 " exceeds the supported maximum " + std::to_string(limit));
}

}  // namespace

Status ModelConfig::Validate() const {
  PD_RETURN_IF_ERROR(Positive("hidden_size", hidden_size));
  PD_RETURN_IF_ERROR(Positive("intermediate_size", intermediate_size));
  PD_RETURN_IF_ERROR(Positive("num_hidden_layers", num_layers));
  PD_RETURN_IF_ERROR(Positive("num_attention_heads", num_heads));
  PD_RETURN_IF_ERROR(Positive("num_key_value_heads", num_kv_heads));
  PD_RETURN_IF_ERROR(Positive("head_dim", head_dim));
  PD_RETURN_IF_ERROR(Positive("vocab_size", vocab_size));
  PD_RETURN_IF_ERROR(Positive("max_position_embeddings", max_position_embeddings));
  PD_RETURN_IF_ERROR(AtMost("hidden_size", hidden_size, kMaxDim));
  PD_RETURN_IF_ERROR(AtMost("intermediate_size", intermediate_size, kMaxDim));
  PD_RETURN_IF_ERROR(AtMost("num_hidden_layers", num_layers, kMaxLayers));
  PD_RETURN_IF_ERROR(AtMost("num_attention_heads * head_dim",
                            static_cast<int64_t>(num_heads) * head_dim, kMaxDim));
  PD_RETURN_IF_ERROR(AtMost("vocab_size", vocab_size, kMaxVocab));
  if (num_heads % num_kv_heads != 0) {
    return Status::InvalidArgument("config: num_attention_heads " + std::to_string(num_heads) +
                                   " is not a multiple of num_key_value_heads " +
                                   std::to_string(num_kv_heads));
  }
  if (!is_mla() && head_dim % 2 != 0) {  // MLA: qk_rope_head_dim, in ValidateMoe
    return Status::InvalidArgument("config: head_dim " + std::to_string(head_dim) +
                                   " must be even (RoPE rotates pairs)");
  }
  if (!(rms_norm_eps > 0) || !(rope_theta > 0)) {
    return Status::InvalidArgument("config: rms_norm_eps and rope_theta must be positive");
  }
  if (sliding_window) PD_RETURN_IF_ERROR(Positive("sliding_window", *sliding_window));
  if (rope_scaling.type != RopeScaling::Type::kNone && !(rope_scaling.factor > 0)) {
    return Status::InvalidArgument("config: rope_scaling.factor must be positive");
  }
  if (rope_scaling.type == RopeScaling::Type::kLlama3) {
    if (!(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor) ||
        !(rope_scaling.low_freq_factor > 0)) {
      return Status::InvalidArgument(
          "config: llama3 rope_scaling needs 0 < low_freq_factor < high_freq_factor");
    }
    PD_RETURN_IF_ERROR(Positive("rope_scaling.original_max_position_embeddings",
                                rope_scaling.original_max_position_embeddings));
  }
  if (bos_token_id && *bos_token_id < 0) {
    return Status::InvalidArgument("config: bos_token_id must not be negative");
  }
  for (int id : eos_token_ids) {
    if (id < 0) return Status::InvalidArgument("config: eos_token_id must not be negative");
  }
  if (quantization.fp8() || quantization.int8()) {
    PD_RETURN_IF_ERROR(Positive("weight_block_size[0]", quantization.block_rows));
    PD_RETURN_IF_ERROR(Positive("weight_block_size[1]", quantization.block_cols));
  }
  return ValidateMlaAndMoe();
}

Status ModelConfig::ValidateMlaAndMoe() const {
  if (is_mla()) {
    if (!IsDeepseek(arch)) return Status::InvalidArgument("config: MLA is only for DeepSeek");
    PD_RETURN_IF_ERROR(Positive("qk_nope_head_dim", mla.qk_nope_head_dim));
    PD_RETURN_IF_ERROR(Positive("qk_rope_head_dim", mla.qk_rope_head_dim));
    PD_RETURN_IF_ERROR(Positive("v_head_dim", mla.v_head_dim));
    PD_RETURN_IF_ERROR(AtMost("kv_lora_rank", mla.kv_lora_rank, 1 << 14));
    PD_RETURN_IF_ERROR(AtMost("q_lora_rank", mla.q_lora_rank, kMaxDim));
    PD_RETURN_IF_ERROR(AtMost("qk_nope_head_dim", mla.qk_nope_head_dim, 1 << 12));
    PD_RETURN_IF_ERROR(AtMost("qk_rope_head_dim", mla.qk_rope_head_dim, 1 << 12));
    PD_RETURN_IF_ERROR(AtMost("v_head_dim", mla.v_head_dim, 1 << 12));
    if (mla.q_lora_rank < 0) return Status::InvalidArgument("config: q_lora_rank < 0");
    if (mla.qk_rope_head_dim % 2 != 0) {
      return Status::InvalidArgument("config: qk_rope_head_dim must be even (RoPE rotates pairs)");
    }
    if (num_kv_heads != 1 || head_dim != mla.latent_dim()) {
      return Status::InvalidArgument("config: an MLA cache is one head of the latent's width");
    }
  } else if (IsDeepseek(arch)) {
    return Status::InvalidArgument("config: DeepSeek needs 'kv_lora_rank' > 0");
  }
  if (num_nextn_predict_layers != 0) {
    if (!IsDeepseek(arch)) {
      return Status::InvalidArgument("config: num_nextn_predict_layers is only for DeepSeek");
    }
    if (num_nextn_predict_layers < 0) {
      return Status::InvalidArgument("config: num_nextn_predict_layers must not be negative");
    }
    PD_RETURN_IF_ERROR(AtMost("num_nextn_predict_layers", num_nextn_predict_layers, 16));
    PD_RETURN_IF_ERROR(AtMost("num_hidden_layers + num_nextn_predict_layers",
                              int64_t{num_layers} + num_nextn_predict_layers, kMaxLayers));
  }
  if (moe.num_experts == 0) return Status::Ok();
  if (arch != Architecture::kQwen3Moe && !IsDeepseek(arch)) {
    return Status::InvalidArgument(
        "config: experts are only implemented for Qwen3MoeForCausalLM and DeepSeek");
  }
  PD_RETURN_IF_ERROR(Positive("moe_layer_freq", moe.layer_freq));
  PD_RETURN_IF_ERROR(Positive("n_group", moe.n_group));
  PD_RETURN_IF_ERROR(Positive("topk_group", moe.topk_group));
  if (moe.first_dense < 0 || moe.shared_experts < 0 || moe.shared_experts > 64) {
    return Status::InvalidArgument(
        "config: first_k_dense_replace and n_shared_experts must be in range");
  }
  if (!(moe.routed_scaling_factor > 0)) {
    return Status::InvalidArgument("config: routed_scaling_factor must be positive");
  }
  if (moe.topk_method != MoeConfig::TopK::kGreedy) {
    if (moe.num_experts % moe.n_group != 0) {
      return Status::InvalidArgument("config: n_group " + std::to_string(moe.n_group) +
                                     " does not divide n_routed_experts " +
                                     std::to_string(moe.num_experts));
    }
    if (moe.topk_group > moe.n_group) {
      return Status::InvalidArgument("config: topk_group exceeds n_group");
    }
    // Enough experts in the kept groups for the top-k (two per group for noaux_tc's scores).
    const int per_group = moe.num_experts / moe.n_group;
    if (moe.topk_group * per_group < moe.experts_per_token ||
        (moe.topk_method == MoeConfig::TopK::kNoAuxTc && per_group < 2)) {
      return Status::InvalidArgument("config: the kept groups hold too few experts for the top-k");
    }
  }
  PD_RETURN_IF_ERROR(Positive("num_experts", moe.num_experts));
  PD_RETURN_IF_ERROR(AtMost("num_experts", moe.num_experts, 4096));
  PD_RETURN_IF_ERROR(Positive("num_experts_per_tok", moe.experts_per_token));
  PD_RETURN_IF_ERROR(AtMost("num_experts_per_tok", moe.experts_per_token, moe.num_experts));
  PD_RETURN_IF_ERROR(Positive("moe_intermediate_size", moe.expert_intermediate));
  PD_RETURN_IF_ERROR(AtMost("moe_intermediate_size", moe.expert_intermediate, kMaxDim));
  PD_RETURN_IF_ERROR(Positive("decoder_sparse_step", moe.sparse_step));
  for (int layer : moe.dense_layers) {
    if (layer < 0 || layer >= num_layers) {
      return Status::InvalidArgument("config: mlp_only_layers names layer " +
                                     std::to_string(layer) + " of a model with " +
                                     std::to_string(num_layers) + " layers");
    }
  }
  return Status::Ok();
}

Result<ModelConfig> ModelConfig::FromJson(const std::string& json_text) {
  PD_ASSIGN_OR_RETURN(json j, ParseJsonText(json_text, "config.json"));
  ModelConfig c;
  PD_ASSIGN_OR_RETURN(const ArchInfo* info, ParseArchitecture(j));
  c.arch = info->arch;
  c.architecture_name = info->name;
  PD_RETURN_IF_ERROR(RejectUnsupportedFeatures(j, c));
  PD_RETURN_IF_ERROR(ParseSizes(j, &c));
  PD_RETURN_IF_ERROR(ParseOptionalFields(j, &c));
  PD_RETURN_IF_ERROR(ParseMoe(j, &c));
  PD_RETURN_IF_ERROR(ParseQuantization(j, &c.quantization));
  PD_RETURN_IF_ERROR(c.Validate());
  return c;
}

Result<ModelConfig> ModelConfig::Load(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  PD_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path));
  Result<ModelConfig> parsed = FromJson(text);
  if (!parsed.ok()) return parsed.status().WithContext(path);
  ModelConfig c = std::move(parsed).value();

  const std::string gen_path = model_dir + "/generation_config.json";
  if (!std::filesystem::exists(gen_path)) return c;
  PD_ASSIGN_OR_RETURN(std::string gen_text, ReadTextFile(gen_path));
  Result<json> gen = ParseJsonText(gen_text, gen_path);
  if (!gen.ok()) return gen.status();
  std::vector<int> eos;
  Status s = ReadTokenIds(*gen, "eos_token_id", &eos);
  if (!s.ok()) return s.WithContext(gen_path);
  for (int id : eos) {
    if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), id) == c.eos_token_ids.end()) {
      c.eos_token_ids.push_back(id);
    }
  }
  if (!c.bos_token_id) {
    std::optional<int> bos;
    s = ReadInt(*gen, "bos_token_id", &bos);
    if (!s.ok()) return s.WithContext(gen_path);
    c.bos_token_id = bos;
  }
  PD_RETURN_IF_ERROR(c.Validate().WithContext(gen_path));
  return c;
}

std::string ModelConfig::ToJson() const {
  json j;
  const ArchInfo& info = InfoOf(arch);
  j["architectures"] = json::array({info.name});
  j["model_type"] = info.model_type;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_layers;
  j["num_attention_heads"] = num_heads;
  j["num_key_value_heads"] = num_kv_heads;
  j["head_dim"] = head_dim;
  j["vocab_size"] = vocab_size;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = tie_word_embeddings;
  if (arch != Architecture::kQwen2 && arch != Architecture::kMistral) j["attention_bias"] = false;
  switch (rope_scaling.type) {
    case RopeScaling::Type::kNone:
      j["rope_scaling"] = nullptr;
      break;
    case RopeScaling::Type::kLinear:
      j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", rope_scaling.factor}};
      break;
    case RopeScaling::Type::kYarn:
      j["rope_scaling"] = {
          {"type", "yarn"},
          {"factor", rope_scaling.factor},
          {"beta_fast", rope_scaling.beta_fast},
          {"beta_slow", rope_scaling.beta_slow},
          {"mscale", rope_scaling.mscale},
          {"mscale_all_dim", rope_scaling.mscale_all_dim},
          {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings}};
      break;
    case RopeScaling::Type::kLlama3:
      j["rope_scaling"] = {
          {"rope_type", "llama3"},
          {"factor", rope_scaling.factor},
          {"low_freq_factor", rope_scaling.low_freq_factor},
          {"high_freq_factor", rope_scaling.high_freq_factor},
          {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings}};
      break;
  }
  if (arch == Architecture::kMistral) {
    j["sliding_window"] = sliding_window ? json(*sliding_window) : json(nullptr);
  } else if (arch != Architecture::kLlama) {
    j["use_sliding_window"] = sliding_window.has_value();
    j["sliding_window"] = sliding_window ? json(*sliding_window) : json(nullptr);
  }
  j["bos_token_id"] = bos_token_id ? json(*bos_token_id) : json(nullptr);
  if (eos_token_ids.size() == 1) {
    j["eos_token_id"] = eos_token_ids[0];
  } else if (eos_token_ids.empty()) {
    j["eos_token_id"] = nullptr;
  } else {
    j["eos_token_id"] = eos_token_ids;
  }
  j["torch_dtype"] = torch_dtype.empty() ? "bfloat16" : torch_dtype;
  if (IsDeepseek(arch)) {
    j.erase("head_dim");
    j["q_lora_rank"] = mla.q_lora_rank > 0 ? json(mla.q_lora_rank) : json(nullptr);
    j["kv_lora_rank"] = mla.kv_lora_rank;
    j["qk_nope_head_dim"] = mla.qk_nope_head_dim;
    j["qk_rope_head_dim"] = mla.qk_rope_head_dim;
    j["v_head_dim"] = mla.v_head_dim;
    j["num_nextn_predict_layers"] = num_nextn_predict_layers;
    j["num_key_value_heads"] = num_heads;  // as DeepSeek's configs say (MLA has no KV heads)
    j["n_routed_experts"] = moe.num_experts > 0 ? json(moe.num_experts) : json(nullptr);
    j["num_experts_per_tok"] = moe.experts_per_token;
    j["moe_intermediate_size"] = moe.expert_intermediate;
    j["n_shared_experts"] = moe.shared_experts;
    j["norm_topk_prob"] = moe.norm_topk_prob;
    j["routed_scaling_factor"] = moe.routed_scaling_factor;
    j["n_group"] = moe.n_group;
    j["topk_group"] = moe.topk_group;
    j["first_k_dense_replace"] = moe.first_dense;
    j["moe_layer_freq"] = moe.layer_freq;
    j["scoring_func"] = moe.scoring == MoeConfig::Scoring::kSigmoid ? "sigmoid" : "softmax";
    j["topk_method"] = moe.topk_method == MoeConfig::TopK::kNoAuxTc ? "noaux_tc"
                       : moe.topk_method == MoeConfig::TopK::kGroupLimitedGreedy
                           ? "group_limited_greedy"
                           : "greedy";
  }
  if (arch == Architecture::kQwen3Moe) {
    j["num_experts"] = moe.num_experts;
    j["num_experts_per_tok"] = moe.experts_per_token;
    j["moe_intermediate_size"] = moe.expert_intermediate;
    j["norm_topk_prob"] = moe.norm_topk_prob;
    j["decoder_sparse_step"] = moe.sparse_step;
    j["mlp_only_layers"] = moe.dense_layers;
  }
  if (quantization.fp8()) {
    j["quantization_config"] = {
        {"quant_method", "fp8"},
        {"fmt", "e4m3"},
        {"activation_scheme", "dynamic"},
        {"weight_block_size", {quantization.block_rows, quantization.block_cols}}};
  } else if (quantization.int8()) {
    j["quantization_config"] = {
        {"quant_method", "int8"},
        {"activation_scheme", "dynamic"},
        {"weight_block_size", {quantization.block_rows, quantization.block_cols}}};
  }
  return j.dump(2) + "\n";
}

}  // namespace pdserve
