// Synthetic model directories for tests (`pdserve make-model` presets), written once per build
// tree under test-models/ and reused by every test process; safe when several processes ask
// at once (each writes a private directory and renames it into place).
#pragma once

#include <string>

#include "common/dtype.h"

namespace pdserve::testing {

// DIR of `preset` (seed 1) with matrices in `dtype`. A failure to write it is a test failure.
std::string SyntheticModelDir(const std::string& preset, DType dtype = DType::kBF16);

// The "tiny" preset in BF16: the model the server, router and `up` tests serve.
inline std::string TinyModelDir() { return SyntheticModelDir("tiny"); }

}  // namespace pdserve::testing
