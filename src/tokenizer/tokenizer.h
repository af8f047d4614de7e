// Tokenizer: text <-> token ids for a model directory. Two implementations:
// - Byte-level BPE from a Hugging Face tokenizer.json (GPT-2, Llama-3, Qwen2 families): BPE
//   vocab + merges ("a b" or ["a", "b"]), ignore_merges; normalizer none, NFC or a Sequence
//   of NFC (full NFC from Unicode 14 tables); pre_tokenizer Split (Regex or String,
//   Isolated), ByteLevel (GPT-2 pattern when use_regex, add_prefix_space), Digits, nested in
//   Sequences, regexes run by PCRE2 with UTF+UCP; added tokens (special or not, lstrip/rstrip)
//   matched in the raw text, longest first; BOS/EOS from a TemplateProcessing post-processor.
//   Anything else (other models, normalizers, pre-tokenizers, byte_fallback BPE) is refused
//   with kUnimplemented, and Load then uses tokenizer.model if there is one.
// - SentencePiece (tokenizer.model) through libsentencepiece.
// Invalid UTF-8 in the text: BPE encodes the bytes themselves (exact round trip);
// SentencePiece sees U+FFFD instead.
// Immutable after Load: Encode/Decode are safe from any thread concurrently.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace pdserve {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Loads DIR/tokenizer.json if present, else DIR/tokenizer.model, plus
  // DIR/tokenizer_config.json (bos/eos, add_bos_token, chat_template) and the eos ids of
  // DIR/generation_config.json where present.
  // Errors name the file and what is wrong; never crashes on a malformed file.
  static Result<std::unique_ptr<Tokenizer>> Load(const std::string& model_dir);

  // add_special: prepend BOS where the tokenizer's config says so (HF add_special_tokens).
  // Special/added tokens written literally in the text (e.g. "<|im_start|>") are matched as
  // single tokens. Invalid UTF-8 never crashes (bytes are encoded as they are, or U+FFFD).
  virtual std::vector<int32_t> Encode(std::string_view text, bool add_special) const = 0;
  // Concatenated text of the ids; skip_special drops special tokens (BOS/EOS/added specials).
  // Ids out of range are skipped. The result may end in a partial UTF-8 sequence only if the
  // ids do; see IncrementalDecoder for streaming.
  virtual std::string Decode(std::span<const int32_t> ids, bool skip_special) const;
  // The raw bytes one id stands for (byte-level decoded; "" for out-of-range ids).
  std::string TokenBytes(int32_t id) const { return InRange(id) ? token_bytes_[id] : ""; }
  bool IsSpecial(int32_t id) const { return InRange(id) && special_[id] != 0; }
  virtual std::optional<int32_t> TokenToId(std::string_view token) const = 0;

  int32_t vocab_size() const { return static_cast<int32_t>(token_bytes_.size()); }
  // Every token Encode emits stands for at most this many bytes of the text it was given,
  // ASCII whitespace not counted (tokenizers may swallow or collapse runs of it), so a text
  // with n other bytes takes at least n / max_text_bytes_per_token() tokens. 0 where no such
  // bound holds (SentencePiece models that normalize or merge unknown characters).
  size_t max_text_bytes_per_token() const { return max_text_bytes_per_token_; }
  std::optional<int32_t> bos_id() const { return bos_id_; }
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  const std::string& chat_template() const { return chat_template_; }
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }

 protected:
  bool InRange(int32_t id) const { return id >= 0 && id < vocab_size(); }

  // The raw bytes and the special flag of every id; filled by the implementation's loader.
  std::vector<std::string> token_bytes_;
  std::vector<uint8_t> special_;
  std::optional<int32_t> bos_id_;
  std::vector<int32_t> eos_ids_;
  std::string chat_template_;
  std::string bos_token_, eos_token_;
  // Whether Encode(add_special=true) prepends BOS / appends EOS (set by Load from the
  // tokenizer's post-processor and tokenizer_config.json).
  bool add_bos_ = false;
  bool add_eos_ = false;
  // See max_text_bytes_per_token(); set by the implementation's loader where it can vouch.
  size_t max_text_bytes_per_token_ = 0;

  // Adds BOS/EOS around `ids` as add_bos_/add_eos_ say. For Encode implementations.
  std::vector<int32_t> WithSpecials(std::vector<int32_t> ids) const;

 private:
  // Applies DIR/tokenizer_config.json and DIR/generation_config.json (both optional) over
  // what the tokenizer file itself said about BOS/EOS.
  Status ApplyConfigs(const std::filesystem::path& dir);
};

// Streams text out of a growing id sequence: emits only complete UTF-8, holding back a
// partial multi-byte character until the ids that complete it arrive. One per sequence;
// thread-compatible.
class IncrementalDecoder {
 public:
  IncrementalDecoder(const Tokenizer* tokenizer, bool skip_special)
      : tokenizer_(tokenizer), skip_special_(skip_special) {}
  // Returns the newly completed text after appending `id`.
  std::string Append(int32_t id);
  // Returns whatever is held back (invalid trailing bytes become U+FFFD).
  std::string Flush();

 private:
  // Takes the complete characters off pending_; `final` also flushes an incomplete tail.
  std::string TakeComplete(bool final);

  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::string pending_;
};

// Writes DIR/tokenizer.json and DIR/tokenizer_config.json for a synthetic byte-level BPE
// tokenizer with exactly vocab_size ids: 256 byte tokens, merges learned deterministically
// from a built-in text (seeded), and special tokens (<|begin_of_text|>, <|end_of_text|>, ...)
// at the top. Round-trips any text and decodes every id. vocab_size >= 300.
Status WriteSyntheticTokenizer(const std::string& model_dir, int32_t vocab_size, uint64_t seed);

}  // namespace pdserve
