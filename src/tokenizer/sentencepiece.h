// SentencePiece tokenizer (tokenizer.model, Llama-2 style) through libsentencepiece.
// Internal to the model module: callers use Tokenizer::Load. Immutable after load;
// Encode/Decode are safe from any thread concurrently (the processor's encode and lookups
// are const and thread-safe).
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "tokenizer/tokenizer.h"

namespace pdserve {

// Loads `path`. BOS/EOS come from the model; add_bos defaults to true (Llama convention);
// the caller may override both from tokenizer_config.json.
Result<std::unique_ptr<Tokenizer>> LoadSentencePiece(const std::string& path);

}  // namespace pdserve
