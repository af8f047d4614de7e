// Pre-tokenization for byte-level BPE: splits normalized text into words with the regex
// stages of a Hugging Face tokenizer.json (`Split` with behavior Isolated, `ByteLevel` with
// its GPT-2 pattern and add_prefix_space, `Digits`), using PCRE2 with UTF and UCP so that
// \p{L}, \p{N} and \s follow Unicode. Immutable after construction: Run may be called from
// several threads at once (each call uses its own match data).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

struct pcre2_real_code_8;

namespace pdserve {

// One compiled pattern (regex or literal) that splits text into matches and the gaps
// between them (HF "Isolated": both kept, in order).
class SplitPattern {
 public:
  static Result<SplitPattern> Compile(std::string_view pattern, bool literal);

  // Appends the pieces of `text` to `out`. Precondition: text is valid UTF-8.
  void Split(std::string_view text, std::vector<std::string>& out) const;

 private:
  struct CodeDeleter {
    void operator()(pcre2_real_code_8* code) const;
  };
  explicit SplitPattern(pcre2_real_code_8* code) : code_(code) {}
  std::unique_ptr<pcre2_real_code_8, CodeDeleter> code_;
};

class PreTokenizer {
 public:
  // Builds from the "pre_tokenizer" value of tokenizer.json (null: no splitting).
  // Unsupported types or behaviors give kUnimplemented naming them.
  static Result<PreTokenizer> FromJson(const nlohmann::json& spec);

  // Splits valid UTF-8 text into words (appended to `words`). Every byte of `text` lands
  // in exactly one word, except spaces added by add_prefix_space.
  void Run(std::string_view text, std::vector<std::string>& words) const;

  // True if a ByteLevel stage was present (the file is a byte-level tokenizer).
  bool has_byte_level() const { return has_byte_level_; }

 private:
  struct Stage {
    bool prefix_space = false;  // ByteLevel add_prefix_space: prepend " " to each piece
    std::shared_ptr<const SplitPattern> pattern;  // null: no split
  };
  Status AddStages(const nlohmann::json& spec, int depth);

  std::vector<Stage> stages_;
  bool has_byte_level_ = false;
};

}  // namespace pdserve
