// Synthetic model directories for tests (`pdserve make-model` presets), written once per build
// tree under test-models/ and reused by every test process; safe when several processes ask
// at once (each writes a private directory and renames it into place).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "model/config.h"
#include "model/synthetic.h"

namespace pdserve::testing {

// DIR of `preset` (seed 1) with matrices in `dtype`. A failure to write it is a test failure.
std::string SyntheticModelDir(const std::string& preset, DType dtype = DType::kBF16);

// DIR of a variant of `preset` (seed 1, BF16): a draft or quiet target for speculative decoding
// (model/synthetic.h).
std::string SyntheticModelDir(const std::string& preset, const SyntheticVariant& variant);
std::string SyntheticModelDir(const std::string& preset, DType dtype,
                              const SyntheticVariant& variant);

// The "tiny" preset in BF16: the model the server, router and `up` tests serve.
inline std::string TinyModelDir() { return SyntheticModelDir("tiny"); }

// What CopyModelDir does to one tensor: false drops it; `bytes` (as stored) may be changed.
using TensorEdit = std::function<bool(const std::string& name, std::vector<uint8_t>& bytes)>;

// Copies model directory `src` into `dst` (created): config.json through `edit_config`, every
// tensor through `edit_tensor` into one model.safetensors, the other files as they are. A
// failure is a test failure.
void CopyModelDir(const std::string& src, const std::string& dst,
                  const std::function<void(ModelConfig&)>& edit_config,
                  const TensorEdit& edit_tensor);

}  // namespace pdserve::testing
