#include "engine/reference_model.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <memory>
#include <numbers>
#include <utility>

#include "common/check.h"
#include "common/dtype.h"
#include "model/safetensors.h"

namespace pdserve::testing {
namespace {

// Reads one tensor of the expected shape and widens it to double. F32 weights widen exactly;
// F16/BF16 go through F32, which holds every value of both exactly.
Result<std::vector<double>> ReadTensor(const SafetensorsSet& set, const std::string& name,
                                       const std::vector<int64_t>& shape) {
  PD_ASSIGN_OR_RETURN(TensorView view, set.FindWithShape(name, shape));
  std::vector<float> as_float(static_cast<size_t>(view.numel()));
  ConvertToF32(view.dtype, view.data, as_float.data(), as_float.size());
  return std::vector<double>(as_float.begin(), as_float.end());
}

// y = W x (+ b), W row-major [out][in] as in Hugging Face's nn.Linear.
std::vector<double> Linear(const std::vector<double>& w, const std::vector<double>& bias,
                           const std::vector<double>& x) {
  const size_t in = x.size();
  PD_CHECK(in > 0 && w.size() % in == 0);
  const size_t out = w.size() / in;
  PD_CHECK(bias.empty() || bias.size() == out);
  std::vector<double> y(out);
  for (size_t o = 0; o < out; ++o) {
    double sum = bias.empty() ? 0.0 : bias[o];
    for (size_t i = 0; i < in; ++i) sum += w[o * in + i] * x[i];
    y[o] = sum;
  }
  return y;
}

// x / sqrt(mean(x^2) + eps) * weight over n elements in place.
void RmsNormInPlace(double* x, const std::vector<double>& weight, double eps) {
  const size_t n = weight.size();
  double sum_sq = 0.0;
  for (size_t i = 0; i < n; ++i) sum_sq += x[i] * x[i];
  const double scale = 1.0 / std::sqrt(sum_sq / static_cast<double>(n) + eps);
  for (size_t i = 0; i < n; ++i) x[i] = x[i] * scale * weight[i];
}

std::vector<double> RmsNorm(const std::vector<double>& x, const std::vector<double>& weight,
                            double eps) {
  PD_CHECK(x.size() == weight.size());
  std::vector<double> y = x;
  RmsNormInPlace(y.data(), weight, eps);
  return y;
}

double Silu(double x) { return x / (1.0 + std::exp(-x)); }

std::string LayerName(int layer, const std::string& suffix) {
  return "model.layers." + std::to_string(layer) + "." + suffix;
}

}  // namespace

std::vector<double> ReferenceModel::RopeInverseFrequencies(const ModelConfig& config) {
  const int dim = config.head_dim;
  std::vector<double> inv_freq(static_cast<size_t>(dim / 2));
  for (int i = 0; i < dim / 2; ++i) {
    inv_freq[i] = 1.0 / std::pow(config.rope_theta, static_cast<double>(2 * i) / dim);
  }
  const RopeScaling& s = config.rope_scaling;
  if (s.type == RopeScaling::Type::kLinear) {
    for (double& f : inv_freq) f /= s.factor;
  } else if (s.type == RopeScaling::Type::kLlama3) {
    // Hugging Face _compute_llama3_parameters: long wavelengths are slowed by `factor`, short
    // ones kept, and those between the two thresholds interpolated smoothly.
    const double old_context = s.original_max_position_embeddings;
    const double low_freq_wavelen = old_context / s.low_freq_factor;
    const double high_freq_wavelen = old_context / s.high_freq_factor;
    for (double& f : inv_freq) {
      const double wavelen = 2.0 * std::numbers::pi / f;
      if (wavelen > low_freq_wavelen) {
        f /= s.factor;
      } else if (wavelen >= high_freq_wavelen) {
        const double smooth =
            (old_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1.0 - smooth) * f / s.factor + smooth * f;
      }
    }
  }
  return inv_freq;
}

Result<ReferenceModel> ReferenceModel::Load(const std::string& dir) {
  ReferenceModel model;
  PD_ASSIGN_OR_RETURN(model.config_, ModelConfig::Load(dir));
  PD_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsSet> set, SafetensorsSet::Open(dir));
  const ModelConfig& c = model.config_;
  const int64_t hidden = c.hidden_size;
  const int64_t q_dim = static_cast<int64_t>(c.num_heads) * c.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  const int64_t inter = c.intermediate_size;

  PD_ASSIGN_OR_RETURN(model.embed_,
                      ReadTensor(*set, "model.embed_tokens.weight", {c.vocab_size, hidden}));
  PD_ASSIGN_OR_RETURN(model.final_norm_, ReadTensor(*set, "model.norm.weight", {hidden}));
  if (!c.tie_word_embeddings) {
    PD_ASSIGN_OR_RETURN(model.lm_head_, ReadTensor(*set, "lm_head.weight", {c.vocab_size, hidden}));
  }
  for (int l = 0; l < c.num_layers; ++l) {
    Layer layer;
    auto read = [&](const std::string& suffix, std::vector<int64_t> shape) {
      return ReadTensor(*set, LayerName(l, suffix), shape);
    };
    PD_ASSIGN_OR_RETURN(layer.input_norm, read("input_layernorm.weight", {hidden}));
    PD_ASSIGN_OR_RETURN(layer.q_proj, read("self_attn.q_proj.weight", {q_dim, hidden}));
    PD_ASSIGN_OR_RETURN(layer.k_proj, read("self_attn.k_proj.weight", {kv_dim, hidden}));
    PD_ASSIGN_OR_RETURN(layer.v_proj, read("self_attn.v_proj.weight", {kv_dim, hidden}));
    if (c.qkv_bias) {
      PD_ASSIGN_OR_RETURN(layer.q_bias, read("self_attn.q_proj.bias", {q_dim}));
      PD_ASSIGN_OR_RETURN(layer.k_bias, read("self_attn.k_proj.bias", {kv_dim}));
      PD_ASSIGN_OR_RETURN(layer.v_bias, read("self_attn.v_proj.bias", {kv_dim}));
    }
    if (c.qk_norm) {
      PD_ASSIGN_OR_RETURN(layer.q_norm, read("self_attn.q_norm.weight", {c.head_dim}));
      PD_ASSIGN_OR_RETURN(layer.k_norm, read("self_attn.k_norm.weight", {c.head_dim}));
    }
    PD_ASSIGN_OR_RETURN(layer.o_proj, read("self_attn.o_proj.weight", {hidden, q_dim}));
    // In Hugging Face, attention_bias biases o_proj too, except in Qwen2 (q/k/v only).
    if (c.qkv_bias && c.arch != Architecture::kQwen2) {
      PD_ASSIGN_OR_RETURN(layer.o_bias, read("self_attn.o_proj.bias", {hidden}));
    }
    PD_ASSIGN_OR_RETURN(layer.post_norm, read("post_attention_layernorm.weight", {hidden}));
    PD_ASSIGN_OR_RETURN(layer.gate_proj, read("mlp.gate_proj.weight", {inter, hidden}));
    PD_ASSIGN_OR_RETURN(layer.up_proj, read("mlp.up_proj.weight", {inter, hidden}));
    PD_ASSIGN_OR_RETURN(layer.down_proj, read("mlp.down_proj.weight", {hidden, inter}));
    model.layers_.push_back(std::move(layer));
  }
  model.inv_freq_ = RopeInverseFrequencies(c);
  return model;
}

ReferenceModel::KvCache ReferenceModel::EmptyCache() const {
  KvCache kv;
  kv.k.resize(layers_.size());
  kv.v.resize(layers_.size());
  return kv;
}

// Hugging Face rotate_half: element i pairs with i + d/2, both turned by position * inv_freq[i].
void ReferenceModel::ApplyRope(double* head, int position) const {
  const size_t half = inv_freq_.size();
  for (size_t i = 0; i < half; ++i) {
    const double angle = position * inv_freq_[i];
    const double cos = std::cos(angle);
    const double sin = std::sin(angle);
    const double x1 = head[i];
    const double x2 = head[i + half];
    head[i] = x1 * cos - x2 * sin;
    head[i + half] = x2 * cos + x1 * sin;
  }
}

std::vector<double> ReferenceModel::Attention(const Layer& layer, int layer_index,
                                              const std::vector<double>& x, int position,
                                              KvCache* kv) const {
  const int head_dim = config_.head_dim;
  const int heads = config_.num_heads;
  const int kv_heads = config_.num_kv_heads;
  std::vector<double> q = Linear(layer.q_proj, layer.q_bias, x);
  std::vector<double> k = Linear(layer.k_proj, layer.k_bias, x);
  std::vector<double> v = Linear(layer.v_proj, layer.v_bias, x);
  for (int h = 0; h < heads; ++h) {
    double* qh = q.data() + static_cast<size_t>(h) * head_dim;
    if (config_.qk_norm) RmsNormInPlace(qh, layer.q_norm, config_.rms_norm_eps);
    ApplyRope(qh, position);
  }
  for (int h = 0; h < kv_heads; ++h) {
    double* kh = k.data() + static_cast<size_t>(h) * head_dim;
    if (config_.qk_norm) RmsNormInPlace(kh, layer.k_norm, config_.rms_norm_eps);
    ApplyRope(kh, position);
  }
  std::vector<std::vector<double>>& keys = kv->k[layer_index];
  std::vector<std::vector<double>>& values = kv->v[layer_index];
  keys.push_back(std::move(k));
  values.push_back(std::move(v));
  PD_CHECK(static_cast<int>(keys.size()) == position + 1);

  // Causal: this position sees 0..position (the last `sliding_window` of them if set).
  int first = 0;
  if (config_.sliding_window) first = std::max(0, position - *config_.sliding_window + 1);
  const int group = heads / kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  std::vector<double> out(static_cast<size_t>(heads) * head_dim, 0.0);
  std::vector<double> scores(static_cast<size_t>(position + 1));
  for (int h = 0; h < heads; ++h) {
    const double* qh = q.data() + static_cast<size_t>(h) * head_dim;
    const size_t kv_offset = static_cast<size_t>(h / group) * head_dim;
    double max_score = -INFINITY;
    for (int j = first; j <= position; ++j) {
      double dot = 0.0;
      for (int d = 0; d < head_dim; ++d) dot += qh[d] * keys[j][kv_offset + d];
      scores[j] = dot * scale;
      max_score = std::max(max_score, scores[j]);
    }
    double denom = 0.0;
    for (int j = first; j <= position; ++j) {
      scores[j] = std::exp(scores[j] - max_score);
      denom += scores[j];
    }
    double* oh = out.data() + static_cast<size_t>(h) * head_dim;
    for (int j = first; j <= position; ++j) {
      const double p = scores[j] / denom;
      for (int d = 0; d < head_dim; ++d) oh[d] += p * values[j][kv_offset + d];
    }
  }
  return Linear(layer.o_proj, layer.o_bias, out);
}

std::vector<double> ReferenceModel::Mlp(const Layer& layer, const std::vector<double>& x) const {
  std::vector<double> gate = Linear(layer.gate_proj, {}, x);
  const std::vector<double> up = Linear(layer.up_proj, {}, x);
  for (size_t i = 0; i < gate.size(); ++i) gate[i] = Silu(gate[i]) * up[i];
  return Linear(layer.down_proj, {}, gate);
}

std::vector<double> ReferenceModel::Step(int32_t token, KvCache* kv) const {
  PD_CHECK(token >= 0 && token < config_.vocab_size);
  const int position = static_cast<int>(kv->k[0].size());
  const size_t hidden = static_cast<size_t>(config_.hidden_size);
  std::vector<double> x(embed_.begin() + static_cast<ptrdiff_t>(token * hidden),
                        embed_.begin() + static_cast<ptrdiff_t>((token + 1) * hidden));
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& layer = layers_[l];
    const std::vector<double> attn =
        Attention(layer, static_cast<int>(l), RmsNorm(x, layer.input_norm, config_.rms_norm_eps),
                  position, kv);
    for (size_t i = 0; i < hidden; ++i) x[i] += attn[i];
    const std::vector<double> mlp = Mlp(layer, RmsNorm(x, layer.post_norm, config_.rms_norm_eps));
    for (size_t i = 0; i < hidden; ++i) x[i] += mlp[i];
  }
  return RmsNorm(x, final_norm_, config_.rms_norm_eps);
}

std::vector<double> ReferenceModel::LmHead(const std::vector<double>& hidden) const {
  return Linear(lm_head_.empty() ? embed_ : lm_head_, {}, hidden);
}

std::vector<double> ReferenceModel::Logits(std::span<const int32_t> tokens) const {
  PD_CHECK(!tokens.empty());
  KvCache kv = EmptyCache();
  std::vector<double> hidden;
  for (int32_t t : tokens) hidden = Step(t, &kv);
  return LmHead(hidden);
}

std::vector<std::vector<double>> ReferenceModel::AllLogits(std::span<const int32_t> tokens) const {
  KvCache kv = EmptyCache();
  std::vector<std::vector<double>> logits;
  logits.reserve(tokens.size());
  for (int32_t t : tokens) logits.push_back(LmHead(Step(t, &kv)));
  return logits;
}

std::vector<int32_t> ReferenceModel::Greedy(std::span<const int32_t> prompt, int n) const {
  PD_CHECK(!prompt.empty() && n >= 0);
  KvCache kv = EmptyCache();
  std::vector<double> hidden;
  for (int32_t t : prompt) hidden = Step(t, &kv);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const std::vector<double> logits = LmHead(hidden);
    // max_element returns the first maximum, so ties go to the lowest id.
    const auto best =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(best);
    if (i + 1 < n) hidden = Step(best, &kv);
  }
  return out;
}

}  // namespace pdserve::testing
