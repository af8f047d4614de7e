// ModelFingerprint: a cheap digest that tells two nodes whether they serve the same model
// (DESIGN.md §3.1: a handshake refuses a mismatch rather than producing garbage tokens).
//
// It hashes (SHA-256) the config's forward-relevant fields (ModelConfig::Fingerprint), the
// size of every *.safetensors file in the directory and 16 samples of 4 KiB spread evenly
// over each file — not every byte: a multi-GB model is fingerprinted in milliseconds. So it
// catches another model, another size, another seed of a synthetic model or a partial copy,
// but not a change confined to unsampled bytes. IdentifyModel adds it to the config's digest and
// the weight dtype: the ModelIdentity nodes compare in the handshake. Pure (reads files); safe
// from any thread.
#pragma once

#include <string>
#include <string_view>

#include "common/dtype.h"
#include "common/model_identity.h"
#include "common/status.h"
#include "model/config.h"

namespace pdserve {

// 32 lower-case hex characters. IoError naming the file that cannot be read.
Result<std::string> ModelFingerprint(const std::string& model_dir, const ModelConfig& config);

// The `weights` field of a node's identity: what the loaded model holds its weights in, as
// resolved at load (not the flags that asked for it): the matrices' dtype ("bf16", "f32") and,
// when the linear layers are held in 8 bits, their format after a '/': "bf16/int8". So
// `--weights auto` on an INT8 checkpoint and `--weights int8` read alike, while two nodes that
// hold the linear layers in different formats (they compute different KV) differ.
std::string WeightsIdentity(DType matrix_dtype, DType linear_dtype);

// The identity of the model in `model_dir` (whose config is `config`) held as `weight_dtype`
// says (WeightsIdentity). Errors as ModelFingerprint.
Result<ModelIdentity> IdentifyModel(const std::string& model_dir, const ModelConfig& config,
                                    std::string weight_dtype);

}  // namespace pdserve
