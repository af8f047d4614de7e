#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pretokenizer.h"

#include <pcre2.h>

#include <utility>

namespace pdserve {
namespace {

// GPT-2's pattern, the default of a ByteLevel pre-tokenizer with use_regex.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Sequences nest in real files at most two levels deep; this only stops runaway recursion.
constexpr int kMaxDepth = 8;

struct MatchDataDeleter {
  void operator()(pcre2_match_data* md) const { pcre2_match_data_free(md); }
};

Result<std::string> StringField(const nlohmann::json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_string()) {
    return Status::InvalidArgument(std::string("pre_tokenizer: \"") + key + "\" must be a string");
  }
  return it->get<std::string>();
}

bool BoolField(const nlohmann::json& obj, const char* key, bool fallback) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

}  // namespace

void SplitPattern::CodeDeleter::operator()(pcre2_real_code_8* code) const { pcre2_code_free(code); }

Result<SplitPattern> SplitPattern::Compile(std::string_view pattern, bool literal) {
  uint32_t options = PCRE2_UTF | PCRE2_UCP;
  if (literal) options |= PCRE2_LITERAL;
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return Status::InvalidArgument("pre_tokenizer regex does not compile at offset " +
                                   std::to_string(offset) + ": " +
                                   reinterpret_cast<const char*>(message));
  }
  // JIT is an optimisation only; the interpreter gives the same matches if it is unavailable.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return SplitPattern(code);
}

void SplitPattern::Split(std::string_view text, std::vector<std::string>& out) const {
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(
      pcre2_match_data_create_from_pattern(code_.get(), nullptr));
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;   // where the next search starts
  size_t done = 0;  // bytes already emitted
  while (pos < text.size()) {
    // NOTEMPTY: an empty match would not advance; the caller validated the UTF-8.
    const int rc = pcre2_match(code_.get(), subject, text.size(), pos,
                               PCRE2_NOTEMPTY | PCRE2_NO_UTF_CHECK, md.get(), nullptr);
    if (rc < 0) break;  // no match (or a resource limit): the rest is one gap piece
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    if (ov[0] > done) out.emplace_back(text.substr(done, ov[0] - done));
    out.emplace_back(text.substr(ov[0], ov[1] - ov[0]));
    done = pos = ov[1];
  }
  if (done < text.size()) out.emplace_back(text.substr(done));
}

Result<PreTokenizer> PreTokenizer::FromJson(const nlohmann::json& spec) {
  PreTokenizer pre;
  PD_RETURN_IF_ERROR(pre.AddStages(spec, 0));
  return pre;
}

Status PreTokenizer::AddStages(const nlohmann::json& spec, int depth) {
  if (spec.is_null()) return Status::Ok();
  if (!spec.is_object()) return Status::InvalidArgument("pre_tokenizer must be an object or null");
  if (depth > kMaxDepth) return Status::InvalidArgument("pre_tokenizer: Sequence nested too deep");
  PD_ASSIGN_OR_RETURN(std::string type, StringField(spec, "type"));
  if (type == "Sequence") {
    auto it = spec.find("pretokenizers");
    if (it == spec.end() || !it->is_array()) {
      return Status::InvalidArgument("pre_tokenizer: Sequence needs a \"pretokenizers\" array");
    }
    for (const auto& child : *it) PD_RETURN_IF_ERROR(AddStages(child, depth + 1));
    return Status::Ok();
  }
  if (type == "ByteLevel") {
    has_byte_level_ = true;
    Stage stage;
    stage.prefix_space = BoolField(spec, "add_prefix_space", true);
    if (BoolField(spec, "use_regex", true)) {
      PD_ASSIGN_OR_RETURN(SplitPattern pattern, SplitPattern::Compile(kGpt2Pattern, false));
      stage.pattern = std::make_shared<const SplitPattern>(std::move(pattern));
    }
    stages_.push_back(std::move(stage));
    return Status::Ok();
  }
  if (type == "Split") {
    PD_ASSIGN_OR_RETURN(std::string behavior, StringField(spec, "behavior"));
    if (behavior != "Isolated" || BoolField(spec, "invert", false)) {
      return Status::Unimplemented("pre_tokenizer: Split with behavior " + behavior +
                                   " (or invert) is not supported; only Isolated");
    }
    auto it = spec.find("pattern");
    if (it == spec.end() || !it->is_object()) {
      return Status::InvalidArgument("pre_tokenizer: Split needs a \"pattern\" object");
    }
    const bool literal = !it->contains("Regex");
    PD_ASSIGN_OR_RETURN(std::string text, StringField(*it, literal ? "String" : "Regex"));
    PD_ASSIGN_OR_RETURN(SplitPattern pattern, SplitPattern::Compile(text, literal));
    stages_.push_back({false, std::make_shared<const SplitPattern>(std::move(pattern))});
    return Status::Ok();
  }
  if (type == "Digits") {
    const char* regex = BoolField(spec, "individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)";
    PD_ASSIGN_OR_RETURN(SplitPattern pattern, SplitPattern::Compile(regex, false));
    stages_.push_back({false, std::make_shared<const SplitPattern>(std::move(pattern))});
    return Status::Ok();
  }
  return Status::Unimplemented("pre_tokenizer type " + type + " is not supported");
}

void PreTokenizer::Run(std::string_view text, std::vector<std::string>& words) const {
  std::vector<std::string> pieces{std::string(text)};
  std::vector<std::string> next;
  for (const Stage& stage : stages_) {
    next.clear();
    for (std::string& piece : pieces) {
      if (stage.prefix_space && !piece.starts_with(' ')) piece.insert(piece.begin(), ' ');
      if (stage.pattern) {
        stage.pattern->Split(piece, next);
      } else {
        next.push_back(std::move(piece));
      }
    }
    pieces.swap(next);
  }
  for (std::string& piece : pieces) {
    if (!piece.empty()) words.push_back(std::move(piece));
  }
}

}  // namespace pdserve
