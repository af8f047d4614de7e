// Synthetic models: the shapes of real models with seeded random weights, written in exactly
// the Hugging Face on-disk format (config.json, generation_config.json, model.safetensors,
// tokenizer.json + tokenizer_config.json), so that every path — loading, the forward pass,
// benchmarks — runs without downloads. Free functions; safe from any thread as long as two
// calls do not write the same directory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "model/config.h"

namespace pdserve {

struct SyntheticPreset {
  std::string name;
  std::string description;
  ModelConfig config;  // bos/eos ids are filled in from the tokenizer when written
};

// Every preset, in a stable order: "tiny" (the embedded default) first, then the small
// per-architecture test models, then the real-size ones ("qwen2.5-0.5b", "llama-3.2-1b").
const std::vector<SyntheticPreset>& SyntheticPresets();
std::vector<std::string> SyntheticPresetNames();
// NotFound listing the known presets if `name` is not one.
Result<ModelConfig> SyntheticPresetConfig(const std::string& name);

// A model derived from a preset, for speculative decoding: a draft model of the preset's first
// `num_layers` decoder layers (every other tensor — embedding, final norm, lm_head — drawn as the
// whole preset's, and no MTP modules), or a target whose layers from `quiet_from_layer` on have
// their output projections (o_proj, down_proj) scaled by `quiet_scale`, so that they add little
// to the residual stream. The truncated preset then drafts the quiet one with high acceptance:
// `make-model --preset tiny --num-layers 2` drafts `make-model --preset tiny --quiet-from-layer 2
// --quiet-scale 0.05` (same seed).
struct SyntheticVariant {
  int num_layers = 0;         // 0: the preset's
  int quiet_from_layer = -1;  // -1: none
  float quiet_scale = 1.0f;   // in [0, 1]
  // Scale of an untied lm_head's weights: > 1 sharpens the next-token distributions (random
  // weights otherwise spread them over hundreds of tokens).
  float head_scale = 1.0f;
  // With quiet layers: the MTP module (DeepSeek presets) drafts what the quiet target says
  // next: its eh_proj is [I | R] (the next token's embedding passed through, plus a little of
  // the hidden state) and its layer is quieted by quiet_scale, so its head sees about the embedding
  // the target's next position mostly sees (the hidden state's half of eh_proj is kept, at a
  // quarter of its scale: the drafts still depend on it).
  bool mtp_mimic = false;
  bool empty() const {
    return num_layers == 0 && quiet_from_layer < 0 && head_scale == 1.0f && !mtp_mimic;
  }
  // "" for the preset itself, else e.g. "l2", "q2x0.05" or "h4": part of a directory name.
  std::string Name() const;
};

// Writes preset `preset` into out_dir (created if needed; existing files are replaced).
// The same (preset, seed, dtype) always gives byte-identical files. DType::kF8E4M3 writes an FP8
// checkpoint as DeepSeek ships one: the linear layers' weights (attention and MLP/expert
// projections) F8_E4M3 with an F32 `weight_scale_inv` per 128 x 128 block (max|w| / 448),
// quantised from the values of the BF16 checkpoint of the same seed (model/quantise.h, so that
// loading that BF16 checkpoint with `--weights fp8` holds the same bytes); the rest BF16; a
// quantization_config in config.json. DType::kI8 writes an INT8 checkpoint the same way: those
// matrices I8 with an F32 `weight_scale` [rows][ceil(cols / 128)] (per row and 128-wide block of
// columns, max|w| / 127), quantization_config {"quant_method": "int8", "weight_block_size":
// [1, 128]}.
Status WriteSyntheticModel(const std::string& preset, const std::string& out_dir, uint64_t seed,
                           DType dtype = DType::kBF16, const SyntheticVariant& variant = {});

// Bytes of the tensors WriteSyntheticModel writes for `config` in `dtype` (the data of
// model.safetensors without its header; kF8E4M3: the FP8 matrices, their F32 scales and the BF16
// rest), as `make-model --list` shows them.
uint64_t SyntheticWeightBytes(const ModelConfig& config, DType dtype);

// Same for any valid config (tests use it for shapes no preset has). config's bos/eos ids are
// replaced by those of the synthetic tokenizer; vocab_size must be at least 300.
Status WriteSyntheticModelFromConfig(const ModelConfig& config, const std::string& out_dir,
                                     uint64_t seed, DType dtype = DType::kBF16);

}  // namespace pdserve
