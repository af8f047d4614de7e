#include "model/synthetic.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/check.h"
#include "model/quantise.h"
#include "model/safetensors.h"
#include "tokenizer/tokenizer.h"

namespace pdserve {
namespace {

using json = nlohmann::json;

// ---- Random weights ----

// How one tensor's values are drawn: center + scale * (approximately) N(0, 1).
struct TensorInit {
  std::string name;
  std::vector<int64_t> shape;
  float center;
  float scale;
  int copy_of = -1;  // >= 0: the values of that tensor of the list (a copy the checkpoint stores)
  int draw_index = -1;  // >= 0: drawn as that tensor of the whole preset's list (a variant's)
  // [rows][2 * rows] = [I | R]: the identity exactly, then R drawn as usual: an MTP module's
  // eh_proj that passes the next token's normed embedding through and adds a little of the
  // hidden state (a mimic variant).
  bool identity = false;
};

// Matrices scale by 1/sqrt(fan_in) so every projection keeps unit-variance activations; the
// embedding by 1/sqrt(hidden) so tied logits have a spread of about one.
TensorInit MatrixInit(std::string name, int64_t rows, int64_t cols) {
  return {std::move(name), {rows, cols}, 0.0f, 1.0f / std::sqrt(static_cast<float>(cols))};
}
TensorInit NormInit(std::string name, int64_t n) { return {std::move(name), {n}, 1.0f, 0.1f}; }
TensorInit BiasInit(std::string name, int64_t n) { return {std::move(name), {n}, 0.0f, 0.1f}; }

// The tensors of one decoder layer `i` (prefix "model.layers.<i>.").
void LayerInits(const ModelConfig& c, int i, std::vector<TensorInit>& t) {
  const int64_t h = c.hidden_size, q = int64_t{c.num_heads} * c.head_dim,
                kv = int64_t{c.num_kv_heads} * c.head_dim, f = c.intermediate_size;
  const std::string p = "model.layers." + std::to_string(i) + ".";
  t.push_back(NormInit(p + "input_layernorm.weight", h));
  if (c.is_mla()) {
    const MlaConfig& a = c.mla;
    const int64_t heads = c.num_heads;
    if (a.q_lora_rank > 0) {
      t.push_back(MatrixInit(p + "self_attn.q_a_proj.weight", a.q_lora_rank, h));
      t.push_back(NormInit(p + "self_attn.q_a_layernorm.weight", a.q_lora_rank));
      t.push_back(
          MatrixInit(p + "self_attn.q_b_proj.weight", heads * a.q_head_dim(), a.q_lora_rank));
    } else {
      t.push_back(MatrixInit(p + "self_attn.q_proj.weight", heads * a.q_head_dim(), h));
    }
    t.push_back(MatrixInit(p + "self_attn.kv_a_proj_with_mqa.weight", a.latent_dim(), h));
    t.push_back(NormInit(p + "self_attn.kv_a_layernorm.weight", a.kv_lora_rank));
    t.push_back(MatrixInit(p + "self_attn.kv_b_proj.weight",
                           heads * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank));
    t.push_back(MatrixInit(p + "self_attn.o_proj.weight", h, heads * a.v_head_dim));
  } else {
    t.push_back(MatrixInit(p + "self_attn.q_proj.weight", q, h));
    t.push_back(MatrixInit(p + "self_attn.k_proj.weight", kv, h));
    t.push_back(MatrixInit(p + "self_attn.v_proj.weight", kv, h));
    if (c.qkv_bias) {
      t.push_back(BiasInit(p + "self_attn.q_proj.bias", q));
      t.push_back(BiasInit(p + "self_attn.k_proj.bias", kv));
      t.push_back(BiasInit(p + "self_attn.v_proj.bias", kv));
    }
    if (c.qk_norm) {
      t.push_back(NormInit(p + "self_attn.q_norm.weight", c.head_dim));
      t.push_back(NormInit(p + "self_attn.k_norm.weight", c.head_dim));
    }
    t.push_back(MatrixInit(p + "self_attn.o_proj.weight", h, q));
  }
  t.push_back(NormInit(p + "post_attention_layernorm.weight", h));
  auto swiglu = [&](const std::string& prefix, int64_t inter) {
    t.push_back(MatrixInit(prefix + "gate_proj.weight", inter, h));
    t.push_back(MatrixInit(prefix + "up_proj.weight", inter, h));
    t.push_back(MatrixInit(prefix + "down_proj.weight", h, inter));
  };
  if (!c.IsMoeLayer(i)) {  // an MTP layer's index i >= num_layers follows the same rule
    swiglu(p + "mlp.", f);
    return;
  }
  const MoeConfig& m = c.moe;
  t.push_back(MatrixInit(p + "mlp.gate.weight", m.num_experts, h));
  if (m.topk_method == MoeConfig::TopK::kNoAuxTc) {
    t.push_back(BiasInit(p + "mlp.gate.e_score_correction_bias", m.num_experts));
  }
  for (int e = 0; e < m.num_experts; ++e) {
    swiglu(p + "mlp.experts." + std::to_string(e) + ".", m.expert_intermediate);
  }
  if (m.shared_experts > 0) {
    swiglu(p + "mlp.shared_experts.", int64_t{m.expert_intermediate} * m.shared_experts);
  }
}

std::vector<TensorInit> TensorInits(const ModelConfig& c) {
  const int64_t h = c.hidden_size;
  std::vector<TensorInit> t;
  t.push_back(MatrixInit("model.embed_tokens.weight", c.vocab_size, h));
  for (int i = 0; i < c.num_layers; ++i) LayerInits(c, i, t);
  // DeepSeek-V3's multi-token-prediction modules follow the last decoder layer, named as V3
  // names them: a decoder layer plus the norms and projection that join the next token's
  // embedding, the head's norm, and copies of the embedding and the lm_head, as V3 stores them
  // (kept for speculative decoding; the forward pass does not read them).
  std::vector<size_t> head_copies;
  for (int k = 0; k < c.num_nextn_predict_layers; ++k) {
    const int mtp = c.num_layers + k;
    LayerInits(c, mtp, t);
    const std::string p = "model.layers." + std::to_string(mtp) + ".";
    t.push_back(NormInit(p + "enorm.weight", h));
    t.push_back(NormInit(p + "hnorm.weight", h));
    t.push_back(MatrixInit(p + "eh_proj.weight", h, 2 * h));
    t.push_back(NormInit(p + "shared_head.norm.weight", h));
    head_copies.push_back(t.size());
    t.push_back(MatrixInit(p + "shared_head.head.weight", c.vocab_size, h));
    t.push_back(MatrixInit(p + "embed_tokens.weight", c.vocab_size, h));
    t.back().copy_of = 0;
  }
  t.push_back(NormInit("model.norm.weight", h));
  if (!c.tie_word_embeddings) t.push_back(MatrixInit("lm_head.weight", c.vocab_size, h));
  const int output = c.tie_word_embeddings ? 0 : static_cast<int>(t.size()) - 1;
  for (size_t i : head_copies) t[i].copy_of = output;
  return t;
}

// The tensors of `variant` of the model `full` (the preset's config): the whole list, each
// tensor drawn as in the whole model (draw_index), less the decoder layers a truncated variant
// drops (and the MTP modules, whose layer index would move), with the quiet layers' output
// projections scaled down.
std::vector<TensorInit> VariantInits(const ModelConfig& full, const SyntheticVariant& variant) {
  std::vector<TensorInit> all = TensorInits(full);
  const int keep = variant.num_layers > 0 ? variant.num_layers : 1 << 30;
  // Decoder layer of a tensor name ("model.layers.<i>."), or -1.
  auto layer_of = [](const std::string& name) {
    constexpr std::string_view kPrefix = "model.layers.";
    if (!name.starts_with(kPrefix)) return -1;
    return std::atoi(name.c_str() + kPrefix.size());
  };
  std::vector<TensorInit> out;
  for (size_t i = 0; i < all.size(); ++i) {
    TensorInit t = all[i];
    t.draw_index = t.copy_of >= 0 ? t.copy_of : static_cast<int>(i);
    t.copy_of = -1;
    const int layer = layer_of(t.name);
    if (layer >= keep) continue;  // dropped (a truncated model has no MTP modules either)
    const bool output_projection =
        t.name.ends_with("self_attn.o_proj.weight") || t.name.ends_with("down_proj.weight");
    if (variant.quiet_from_layer >= 0 && layer >= variant.quiet_from_layer &&
        layer < full.num_layers && output_projection) {
      t.scale *= variant.quiet_scale;
    }
    if (variant.mtp_mimic && layer >= full.num_layers) {
      if (output_projection) t.scale *= variant.quiet_scale;
      if (t.name.ends_with("eh_proj.weight")) {
        t.identity = true;
        t.scale *= 0.25f;  // the hidden state's part: enough to matter, little enough to mimic
      }
    }
    if (t.name == "lm_head.weight") t.scale *= variant.head_scale;
    out.push_back(std::move(t));
  }
  return out;
}

// SplitMix64: tiny state, good enough statistics for weights, about a nanosecond per draw.
struct SplitMix64 {
  uint64_t state;
  uint64_t Next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
};

// Sum of the four 16-bit lanes of a uniform draw (Irwin-Hall): mean 0, unit variance,
// bounded by +-3.46. Close enough to normal for weights and much cheaper than Box-Muller.
inline float ApproxNormal(uint64_t x) {
  const int sum = static_cast<int>(x & 0xffff) + static_cast<int>((x >> 16) & 0xffff) +
                  static_cast<int>((x >> 32) & 0xffff) + static_cast<int>(x >> 48);
  constexpr float kInvStd = 1.7320508f / 65536.0f;  // sqrt(3) / 2^16
  return static_cast<float>(sum - 2 * 65535) * kInvStd;
}

constexpr size_t kChunk = size_t{1} << 16;  // elements per independently seeded chunk

// Fills chunk `chunk` of tensor `index`. Each chunk has its own seed, so the values do not
// depend on how chunks are spread over threads.
void FillChunk(const TensorInit& init, uint64_t seed, size_t index, size_t chunk, size_t numel,
               DType dtype, void* out) {
  SplitMix64 rng{seed ^ (0xd1b54a32d192ed03ull * (index + 1)) ^
                 (0x8cb92ba72f3d8dd7ull * (chunk + 1))};
  const size_t begin = chunk * kChunk, end = std::min(numel, begin + kChunk);
  for (int i = 0; i < 4; ++i) rng.Next();  // decorrelate neighbouring seeds
  const size_t cols = init.shape.size() == 2 ? static_cast<size_t>(init.shape[1]) : 1;
  const size_t rows = init.shape.empty() ? 1 : static_cast<size_t>(init.shape[0]);
  auto value = [&](size_t i) {
    if (init.identity && i % cols < rows) return i % cols == i / cols ? 1.0f : 0.0f;
    return init.center + init.scale * ApproxNormal(rng.Next());
  };
  switch (dtype) {
    case DType::kF32: {
      float* o = static_cast<float*>(out);
      for (size_t i = begin; i < end; ++i) o[i] = value(i);
      break;
    }
    case DType::kBF16: {
      uint16_t* o = static_cast<uint16_t*>(out);
      for (size_t i = begin; i < end; ++i) o[i] = F32ToBF16(value(i));
      break;
    }
    case DType::kF16: {
      uint16_t* o = static_cast<uint16_t*>(out);
      for (size_t i = begin; i < end; ++i) o[i] = F32ToF16(value(i));
      break;
    }
    case DType::kF8E4M3:  // quantised per block from the draws (Quantiser)
    case DType::kI8:
      PD_CHECK_MSG(false, "8-bit tensors are drawn in F32 and quantised by blocks");
  }
}

void FillTensor(const TensorInit& init, uint64_t seed, size_t index, DType dtype, void* out) {
  size_t numel = 1;
  for (int64_t d : init.shape) numel *= static_cast<size_t>(d);
  const size_t chunks = (numel + kChunk - 1) / kChunk;
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t c = next.fetch_add(1); c < chunks; c = next.fetch_add(1)) {
      FillChunk(init, seed, index, c, numel, dtype, out);
    }
  };
  const size_t threads =
      std::min<size_t>({std::max(1u, std::thread::hardware_concurrency()), 16, chunks});
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
}

// ---- 8-bit checkpoints (FP8, INT8) ----

// The tensors an 8-bit checkpoint stores quantised (model/quantise.h's policy, DeepSeek's).
bool IsQuantisedLinear(const TensorInit& t) {
  return t.shape.size() == 2 && IsQuantisedLinearName(t.name);
}

bool IsQuantisedDType(DType dtype) { return dtype == DType::kF8E4M3 || dtype == DType::kI8; }

// The name of a quantised matrix's scale tensor: DeepSeek's `weight_scale_inv` for FP8 (the
// name says inverse, the value multiplies), `weight_scale` for INT8.
std::string ScaleTensorSuffix(DType dtype) {
  return dtype == DType::kF8E4M3 ? "_scale_inv" : "_scale";
}

// One matrix of an 8-bit checkpoint: the values the BF16 checkpoint of the same seed holds (the
// F32 draws rounded to BF16), quantised as model/quantise.h says. So `make-model --dtype fp8`
// (int8) writes what loading the BF16 checkpoint with `--weights fp8` (int8) holds in memory.
class Quantiser {
 public:
  Quantiser(const TensorInit& init, uint64_t seed, size_t index, DType dtype)
      : dtype_(dtype),
        rows_(init.shape[0]),
        cols_(init.shape[1]),
        values_(static_cast<size_t>(rows_ * cols_)) {
    FillTensor(init, seed, index, DType::kF32, values_.data());
    for (float& v : values_) v = BF16ToF32(F32ToBF16(v));
  }
  // FP8: [ceil(rows / 128)][ceil(cols / 128)]; INT8: [rows][ceil(cols / 128)].
  static std::vector<int64_t> ScaleShape(const std::vector<int64_t>& shape, DType dtype) {
    const int64_t cols = (shape[1] + kQuantBlock - 1) / kQuantBlock;
    if (dtype == DType::kI8) return {shape[0], cols};
    return {(shape[0] + kQuantBlock - 1) / kQuantBlock, cols};
  }
  void Scales(float* out) const {
    std::vector<uint8_t> bytes(values_.size());
    Quantise(bytes.data(), out);
  }
  void Values(uint8_t* out) const {
    const std::vector<int64_t> shape = ScaleShape({rows_, cols_}, dtype_);
    std::vector<float> scales(static_cast<size_t>(shape[0] * shape[1]));
    Quantise(out, scales.data());
  }

 private:
  // Every 128-row block on its own (rows are independent), spread over threads.
  void Quantise(uint8_t* out, float* scales) const {
    const int64_t block_rows = (rows_ + kQuantBlock - 1) / kQuantBlock;
    const int64_t scale_cols = (cols_ + kQuantBlock - 1) / kQuantBlock;
    std::atomic<int64_t> next{0};
    auto worker = [&] {
      for (int64_t br = next.fetch_add(1); br < block_rows; br = next.fetch_add(1)) {
        const int64_t r0 = br * kQuantBlock, rows = std::min<int64_t>(kQuantBlock, rows_ - r0);
        const float* w = values_.data() + r0 * cols_;
        if (dtype_ == DType::kF8E4M3) {
          QuantiseFp8Rows(w, rows, cols_, out + r0 * cols_, scales + br * scale_cols);
        } else {
          QuantiseInt8Rows(w, rows, cols_, reinterpret_cast<int8_t*>(out + r0 * cols_),
                           scales + r0 * scale_cols);
        }
      }
    };
    const int64_t threads =
        std::min<int64_t>({std::max(1u, std::thread::hardware_concurrency()), 16, block_rows});
    std::vector<std::thread> pool;
    for (int64_t t = 1; t < threads; ++t) pool.emplace_back(worker);
    worker();
    for (std::thread& t : pool) t.join();
  }

  DType dtype_;
  int64_t rows_, cols_;
  std::vector<float> values_;
};

// The tensors of the file and how each is filled: in `dtype` from the draws of tensor `init`,
// or (an 8-bit checkpoint) its quantised values or their scales.
struct FileTensor {
  enum class Kind : uint8_t { kDrawn, kQuantisedValues, kQuantisedScales } kind;
  size_t init;
};

Status WriteWeights(const std::string& path, const std::vector<TensorInit>& inits, uint64_t seed,
                    DType dtype) {
  std::vector<TensorToWrite> tensors;
  std::vector<FileTensor> sources;
  for (size_t i = 0; i < inits.size(); ++i) {
    const TensorInit& t = inits[i];
    if (IsQuantisedDType(dtype) && IsQuantisedLinear(t)) {
      tensors.push_back({t.name, dtype, t.shape, nullptr});
      sources.push_back({FileTensor::Kind::kQuantisedValues, i});
      tensors.push_back({t.name + ScaleTensorSuffix(dtype), DType::kF32,
                         Quantiser::ScaleShape(t.shape, dtype), nullptr});
      sources.push_back({FileTensor::Kind::kQuantisedScales, i});
    } else {
      // An 8-bit checkpoint keeps the rest in BF16.
      tensors.push_back({t.name, IsQuantisedDType(dtype) ? DType::kBF16 : dtype, t.shape, nullptr});
      sources.push_back({FileTensor::Kind::kDrawn, i});
    }
  }
  return WriteSafetensorsStreamed(path, tensors, [&](size_t f, void* out) {
    const FileTensor& source = sources[f];
    const TensorInit& init = inits[source.init];
    // A copy is drawn as its original (same shape and scale): the same values.
    const size_t draw = init.copy_of >= 0      ? static_cast<size_t>(init.copy_of)
                        : init.draw_index >= 0 ? static_cast<size_t>(init.draw_index)
                                               : source.init;
    switch (source.kind) {
      case FileTensor::Kind::kDrawn:
        FillTensor(init, seed, draw, tensors[f].dtype, out);
        break;
      case FileTensor::Kind::kQuantisedValues:
        Quantiser(init, seed, draw, dtype).Values(static_cast<uint8_t*>(out));
        break;
      case FileTensor::Kind::kQuantisedScales:
        Quantiser(init, seed, draw, dtype).Scales(static_cast<float*>(out));
        break;
    }
    return Status::Ok();
  });
}

// ---- Files ----

Status WriteTextFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return Status::IoError("cannot write " + path);
  return Status::Ok();
}

Result<json> ReadJson(const std::string& path, const json::parser_callback_t& filter = nullptr) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("cannot open " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return json::parse(ss.str(), filter);
  } catch (const json::exception& e) {
    return Status::DataLoss(path + ": invalid JSON: " + e.what());
  }
}

// The token named by tokenizer_config.json's `key` (a string or {"content": ...}).
Result<std::string> SpecialTokenText(const json& config, const std::string& key) {
  auto it = config.find(key);
  if (it != config.end() && it->is_string()) return it->get<std::string>();
  if (it != config.end() && it->is_object() && it->contains("content") &&
      (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return Status::DataLoss("synthetic tokenizer_config.json has no " + key);
}

// BOS and EOS ids as the tokenizer just written defines them, so that config.json agrees
// with the tokenizer whatever id layout the tokenizer writer chose.
Status ReadSpecialIds(const std::string& dir, int* bos, int* eos) {
  PD_ASSIGN_OR_RETURN(json config, ReadJson(dir + "/tokenizer_config.json"));
  PD_ASSIGN_OR_RETURN(std::string bos_text, SpecialTokenText(config, "bos_token"));
  PD_ASSIGN_OR_RETURN(std::string eos_text, SpecialTokenText(config, "eos_token"));
  // Skip the (large) "model" object: only added_tokens is needed.
  json::parser_callback_t skip_model = [](int depth, json::parse_event_t event, json& parsed) {
    return !(depth == 1 && event == json::parse_event_t::key && parsed == "model");
  };
  PD_ASSIGN_OR_RETURN(json tokenizer, ReadJson(dir + "/tokenizer.json", skip_model));
  *bos = *eos = -1;
  if (tokenizer.contains("added_tokens") && tokenizer["added_tokens"].is_array()) {
    for (const json& t : tokenizer["added_tokens"]) {
      if (!t.contains("content") || !t.contains("id") || !t["id"].is_number_integer()) continue;
      if (t["content"] == bos_text) *bos = t["id"].get<int>();
      if (t["content"] == eos_text) *eos = t["id"].get<int>();
    }
  }
  if (*bos < 0 || *eos < 0) {
    return Status::Internal("synthetic tokenizer in " + dir + " lacks ids for " + bos_text + " / " +
                            eos_text);
  }
  return Status::Ok();
}

// Refuses a directory whose other weight files would be loaded alongside ours.
Status CheckOutputDir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IoError("cannot create directory " + dir + ": " + ec.message());
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename();
    if ((entry.path().extension() == ".safetensors" && name != "model.safetensors") ||
        name == "model.safetensors.index.json") {
      return Status::FailedPrecondition(dir + " already holds " + name +
                                        ", which would be loaded with the new weights; use an "
                                        "empty directory");
    }
  }
  if (ec) return Status::IoError("cannot list " + dir + ": " + ec.message());
  return Status::Ok();
}

const char* TorchDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "float32";
    case DType::kF16:
      return "float16";
    case DType::kBF16:
    case DType::kF8E4M3:  // as DeepSeek's FP8 configs: the unquantised tensors are BF16
    case DType::kI8:
      return "bfloat16";
  }
  return "bfloat16";
}

// Writes the tokenizer, config.json and the tensors `inits` of `config_in`.
Status WriteSyntheticModelWith(const ModelConfig& config_in, std::vector<TensorInit> inits,
                               const std::string& out_dir, uint64_t seed, DType dtype);

}  // namespace

uint64_t SyntheticWeightBytes(const ModelConfig& config, DType dtype) {
  uint64_t bytes = 0;
  for (const TensorInit& t : TensorInits(config)) {
    uint64_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
    if (IsQuantisedDType(dtype) && IsQuantisedLinear(t)) {
      const std::vector<int64_t> scales = Quantiser::ScaleShape(t.shape, dtype);
      bytes += numel + sizeof(float) * static_cast<uint64_t>(scales[0] * scales[1]);
    } else {
      bytes += numel * DTypeSize(IsQuantisedDType(dtype) ? DType::kBF16 : dtype);
    }
  }
  return bytes;
}

std::string SyntheticVariant::Name() const {
  std::string name;
  if (num_layers > 0) name += "l" + std::to_string(num_layers);
  if (quiet_from_layer >= 0) {
    char scale[32];
    std::snprintf(scale, sizeof(scale), "%g", static_cast<double>(quiet_scale));
    name += (name.empty() ? "" : "-") + std::string("q") + std::to_string(quiet_from_layer) + "x" +
            scale;
  }
  if (head_scale != 1.0f) {
    char scale[32];
    std::snprintf(scale, sizeof(scale), "%g", static_cast<double>(head_scale));
    name += (name.empty() ? "" : "-") + std::string("h") + scale;
  }
  if (mtp_mimic) name += (name.empty() ? "" : "-") + std::string("mtp");
  return name;
}

Status WriteSyntheticModel(const std::string& preset, const std::string& out_dir, uint64_t seed,
                           DType dtype, const SyntheticVariant& variant) {
  PD_ASSIGN_OR_RETURN(ModelConfig config, SyntheticPresetConfig(preset));
  if (variant.empty()) return WriteSyntheticModelFromConfig(config, out_dir, seed, dtype);
  if (variant.num_layers < 0 || variant.num_layers > config.num_layers) {
    return Status::InvalidArgument(
        fmt::format("{} layers: preset {} has {}", variant.num_layers, preset, config.num_layers));
  }
  if (variant.quiet_from_layer >= config.num_layers ||
      !(variant.quiet_scale >= 0.0f && variant.quiet_scale <= 1.0f)) {
    return Status::InvalidArgument(
        fmt::format("quiet layers from {} scaled by {}: preset {} has {} layers, the scale must "
                    "be in [0, 1]",
                    variant.quiet_from_layer, variant.quiet_scale, preset, config.num_layers));
  }
  if (variant.mtp_mimic && (config.num_nextn_predict_layers < 1 || variant.num_layers > 0 ||
                            variant.quiet_from_layer < 0)) {
    return Status::InvalidArgument(
        fmt::format("--mtp-mimic needs a preset with an MTP module ({} has {}), all its layers, "
                    "and --quiet-from-layer (its module is quieted by --quiet-scale too)",
                    preset, config.num_nextn_predict_layers));
  }
  if (!(variant.head_scale > 0.0f) || (variant.head_scale != 1.0f && config.tie_word_embeddings)) {
    return Status::InvalidArgument(
        fmt::format("head scale {}: must be positive, and preset {} must have an untied lm_head",
                    variant.head_scale, preset));
  }
  std::vector<TensorInit> inits = VariantInits(config, variant);
  if (variant.num_layers > 0) {
    config.num_layers = variant.num_layers;
    config.num_nextn_predict_layers = 0;
  }
  return WriteSyntheticModelWith(config, std::move(inits), out_dir, seed, dtype);
}

Status WriteSyntheticModelFromConfig(const ModelConfig& config, const std::string& out_dir,
                                     uint64_t seed, DType dtype) {
  return WriteSyntheticModelWith(config, TensorInits(config), out_dir, seed, dtype);
}

namespace {

Status WriteSyntheticModelWith(const ModelConfig& config_in, std::vector<TensorInit> inits,
                               const std::string& out_dir, uint64_t seed, DType dtype) {
  PD_RETURN_IF_ERROR(config_in.Validate());
  PD_RETURN_IF_ERROR(CheckOutputDir(out_dir));
  PD_RETURN_IF_ERROR(WriteSyntheticTokenizer(out_dir, config_in.vocab_size, seed));
  int bos = 0, eos = 0;
  PD_RETURN_IF_ERROR(ReadSpecialIds(out_dir, &bos, &eos));

  ModelConfig config = config_in;
  config.bos_token_id = bos;
  config.eos_token_ids = {eos};
  config.torch_dtype = TorchDTypeName(dtype);
  if (dtype == DType::kF8E4M3) {
    config.quantization = {.method = QuantizationConfig::Method::kFp8,
                           .block_rows = kQuantBlock,
                           .block_cols = kQuantBlock};
  } else if (dtype == DType::kI8) {
    config.quantization = {
        .method = QuantizationConfig::Method::kInt8, .block_rows = 1, .block_cols = kQuantBlock};
  }
  PD_RETURN_IF_ERROR(WriteTextFile(out_dir + "/config.json", config.ToJson()));
  const json generation = {{"bos_token_id", bos}, {"eos_token_id", eos}};
  PD_RETURN_IF_ERROR(WriteTextFile(out_dir + "/generation_config.json", generation.dump(2) + "\n"));

  return WriteWeights(out_dir + "/model.safetensors", inits, seed, dtype);
}

}  // namespace

}  // namespace pdserve
