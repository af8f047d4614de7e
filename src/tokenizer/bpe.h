// Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json (GPT-2, Llama-3, Qwen2
// families). Internal to the model module: callers use Tokenizer::Load.
// Immutable after load except for an internal, mutex-guarded word cache, so Encode/Decode
// are safe from any thread concurrently.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "tokenizer/tokenizer.h"

namespace pdserve {

// Builds the tokenizer from a parsed tokenizer.json (`path` only names the file in errors).
// kUnimplemented if the file is not a byte-level BPE (e.g. a SentencePiece-style
// Metaspace/byte_fallback model), so the caller can fall back to tokenizer.model.
// bos/eos and add_bos are taken from the post-processor; the caller may override them.
Result<std::unique_ptr<Tokenizer>> LoadByteLevelBpe(const nlohmann::json& file,
                                                    const std::string& path);

}  // namespace pdserve
