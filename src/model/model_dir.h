// LoadModelDir: everything a serving process needs from a Hugging Face model directory —
// config, tokenizer and a ready Transformer. Call from one thread; the result is owned by
// the caller.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "common/status.h"
#include "model/config.h"
#include "model/transformer.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace pdserve {

struct ModelDirOptions {
  std::optional<DType> weight_dtype;   // LoadWeights: nullopt = as the checkpoint
  std::optional<DType> weight_format;  // LoadWeights' linear_format (`--weights`)
  std::optional<DType> head_format;    // LoadWeights' head_format (`--lm-head`): nullopt = auto
  TransformerOptions transformer;
  bool load_tokenizer = true;
};

struct ModelDir {
  std::string path;
  ModelConfig config;
  std::unique_ptr<Tokenizer> tokenizer;  // null if load_tokenizer was false
  std::unique_ptr<Transformer> transformer;
};

// Errors name the directory and the file at fault.
Result<ModelDir> LoadModelDir(const std::string& path, const ModelDirOptions& options);

}  // namespace pdserve
