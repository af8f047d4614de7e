#include "tokenizer/bpe.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <queue>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/nfc.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/utf8.h"

namespace pdserve {
namespace {

using nlohmann::json;

// Ids beyond this are certainly a corrupt file (the largest real vocabularies are ~260k).
constexpr int64_t kMaxTokenId = 1 << 24;
// Real files number their tokens densely; a few holes are tolerated, but a stray huge id
// would make the per-id tables (sized by the largest id) absurdly large.
constexpr int64_t kMaxIdHoles = 4096;
// The word cache holds short words only (long ones are rare and cheap to skip) and is
// cleared when full, which bounds its memory without an eviction policy.
constexpr size_t kMaxCachedWordBytes = 64;
constexpr size_t kMaxCacheEntries = 1 << 16;

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// obj[key], or null when obj is not an object or lacks key (json::value would throw).
const json& Get(const json& obj, const char* key) {
  static const json kNull;
  if (!obj.is_object()) return kNull;
  auto it = obj.find(key);
  return it == obj.end() ? kNull : *it;
}

Status Invalid(const std::string& path, const std::string& what) {
  return Status::InvalidArgument(path + ": " + what);
}

class ByteLevelBpe final : public Tokenizer {
 public:
  std::vector<int32_t> Encode(std::string_view text, bool add_special) const override;
  std::optional<int32_t> TokenToId(std::string_view token) const override;

  // Loading steps, in order; each validates its part of the file.
  Status LoadVocab(const json& model, const std::string& path);
  Status LoadAddedTokens(const json& file, const std::string& path);
  Status LoadMerges(const json& model, const std::string& path);
  Status LoadNormalizer(const json& file, const std::string& path);
  Status LoadPreTokenizer(const json& file, const std::string& path);
  void LoadPostProcessor(const json& file);
  Status FinishLoad(const std::string& path);

 private:
  struct Merge {
    int32_t rank;
    int32_t merged;
  };

  // Encodes text that holds no added tokens (any bytes; invalid UTF-8 is kept as bytes).
  void EncodeSegment(std::string_view text, std::vector<int32_t>& ids) const;
  void EncodeWord(std::string_view word, std::vector<int32_t>& ids) const;
  void MergeWord(std::string_view word, std::vector<int32_t>& ids) const;

  // Collected while loading, before the per-id tables are sized.
  std::vector<AddedTokenMatcher::Token> added_;
  std::vector<int32_t> special_ids_;
  std::unordered_map<std::string, int32_t> vocab_;     // byte-level form -> id
  std::unordered_map<std::string, int32_t> added_id_;  // added token content -> id
  AddedTokenMatcher added_matcher_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::array<int32_t, 256> byte_ids_{};
  PreTokenizer pre_;
  bool nfc_ = false;
  bool ignore_merges_ = false;
  int64_t max_id_ = -1;

  mutable Mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_ GUARDED_BY(cache_mu_);
};

Status ByteLevelBpe::LoadVocab(const json& model, const std::string& path) {
  auto it = model.find("vocab");
  if (it == model.end() || !it->is_object()) {
    return Invalid(path, "model.vocab must be an object of token -> id");
  }
  vocab_.reserve(it->size());
  for (const auto& [token, id] : it->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= kMaxTokenId) {
      return Invalid(path, "model.vocab[\"" + token + "\"] is not a valid id");
    }
    vocab_.emplace(token, id.get<int32_t>());
    max_id_ = std::max(max_id_, id.get<int64_t>());
  }
  ignore_merges_ = Get(model, "ignore_merges") == true;
  return Status::Ok();
}

Status ByteLevelBpe::LoadAddedTokens(const json& file, const std::string& path) {
  auto it = file.find("added_tokens");
  if (it == file.end() || it->is_null()) return Status::Ok();
  if (!it->is_array()) return Invalid(path, "added_tokens must be an array");
  for (size_t i = 0; i < it->size(); ++i) {
    const json& t = (*it)[i];
    const std::string where = "added_tokens[" + std::to_string(i) + "]";
    if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
        !t.contains("content") || !t["content"].is_string()) {
      return Invalid(path, where + " needs an integer \"id\" and a string \"content\"");
    }
    const int64_t id = t["id"].get<int64_t>();
    std::string content = t["content"].get<std::string>();
    if (id < 0 || id >= kMaxTokenId) return Invalid(path, where + " has an invalid id");
    if (content.empty()) return Invalid(path, where + " has empty content");
    auto flag = [&t](const char* key) {
      return t.contains(key) && t[key].is_boolean() && t[key].get<bool>();
    };
    max_id_ = std::max(max_id_, id);
    added_id_[content] = static_cast<int32_t>(id);
    added_.push_back(
        {std::move(content), static_cast<int32_t>(id), flag("lstrip"), flag("rstrip")});
    if (flag("special")) special_ids_.push_back(static_cast<int32_t>(id));
  }
  return Status::Ok();
}

// Merges come as "a b" strings (older files) or ["a", "b"] pairs (newer files).
Status ByteLevelBpe::LoadMerges(const json& model, const std::string& path) {
  auto it = model.find("merges");
  if (it == model.end() || it->is_null()) return Status::Ok();
  if (!it->is_array()) return Invalid(path, "model.merges must be an array");
  merges_.reserve(it->size() * 2);
  for (size_t rank = 0; rank < it->size(); ++rank) {
    const json& m = (*it)[rank];
    std::string a, b;
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        return Invalid(path, "model.merges[" + std::to_string(rank) + "] is not \"a b\"");
      }
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      return Invalid(path, "model.merges[" + std::to_string(rank) + "] is not a pair of strings");
    }
    auto ia = vocab_.find(a), ib = vocab_.find(b), im = vocab_.find(a + b);
    if (ia == vocab_.end() || ib == vocab_.end() || im == vocab_.end()) {
      return Invalid(path, "model.merges[" + std::to_string(rank) + "] (\"" + a + "\", \"" + b +
                               "\") uses a token missing from model.vocab");
    }
    // A later duplicate wins, as in the reference implementation.
    merges_.insert_or_assign(PairKey(ia->second, ib->second),
                             Merge{static_cast<int32_t>(rank), im->second});
  }
  return Status::Ok();
}

// Supported normalizers: none, NFC, or a Sequence of NFC (what byte-level files use).
Status ByteLevelBpe::LoadNormalizer(const json& file, const std::string& path) {
  auto it = file.find("normalizer");
  if (it == file.end() || it->is_null()) return Status::Ok();
  std::vector<const json*> todo{&*it};
  while (!todo.empty()) {
    const json& n = *todo.back();
    todo.pop_back();
    if (!n.is_object() || !n.contains("type") || !n["type"].is_string()) {
      return Invalid(path, "normalizer must be an object with a string \"type\"");
    }
    const std::string type = n["type"].get<std::string>();
    if (type == "NFC") {
      nfc_ = true;
    } else if (type == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array()) {
      for (const json& child : n["normalizers"]) todo.push_back(&child);
    } else {
      return Status::Unimplemented(path + ": normalizer " + type + " is not supported");
    }
  }
  return Status::Ok();
}

Status ByteLevelBpe::LoadPreTokenizer(const json& file, const std::string& path) {
  auto it = file.find("pre_tokenizer");
  Result<PreTokenizer> pre = PreTokenizer::FromJson(it == file.end() ? json() : *it);
  if (!pre.ok()) return pre.status().WithContext(path);
  pre_ = std::move(pre).value();
  auto dec = file.find("decoder");
  const bool byte_level_decoder = dec != file.end() && Get(*dec, "type") == "ByteLevel";
  if (!pre_.has_byte_level() && !byte_level_decoder) {
    return Status::Unimplemented(path +
                                 ": not a byte-level BPE (no ByteLevel pre-tokenizer or "
                                 "decoder)");
  }
  return Status::Ok();
}

// BOS/EOS from a TemplateProcessing post-processor (Llama-3 style "<bos> $A"), alone or in a
// Sequence. Anything else is left alone: post-processing does not change the vocabulary.
void ByteLevelBpe::LoadPostProcessor(const json& file) {
  auto it = file.find("post_processor");
  if (it == file.end() || !it->is_object()) return;
  std::vector<const json*> processors{&*it};
  if (Get(*it, "type") == "Sequence" && it->contains("processors") &&
      (*it)["processors"].is_array()) {
    processors.clear();
    for (const json& p : (*it)["processors"]) processors.push_back(&p);
  }
  for (const json* p : processors) {
    if (!p->is_object() || Get(*p, "type") != "TemplateProcessing") continue;
    const json single = Get(*p, "single");
    const json specials = Get(*p, "special_tokens");
    if (!single.is_array() || single.empty() || !specials.is_object()) continue;
    auto special_id = [&specials](const json& element) -> std::optional<int32_t> {
      if (!element.is_object() || !element.contains("SpecialToken")) return std::nullopt;
      const json name = Get(element["SpecialToken"], "id");
      if (!name.is_string() || !specials.contains(name.get<std::string>())) return std::nullopt;
      const json ids = Get(specials[name.get<std::string>()], "ids");
      if (!ids.is_array() || ids.size() != 1 || !ids[0].is_number_integer()) return std::nullopt;
      return ids[0].get<int32_t>();
    };
    if (auto bos = special_id(single.front())) {
      bos_id_ = *bos;
      add_bos_ = true;
    }
    if (single.size() > 1) {
      if (auto eos = special_id(single.back())) {
        eos_ids_ = {*eos};
        add_eos_ = true;
      }
    }
  }
}

Status ByteLevelBpe::FinishLoad(const std::string& path) {
  if (max_id_ < 0) return Invalid(path, "the vocabulary is empty");
  const auto entries = static_cast<int64_t>(vocab_.size() + added_.size());
  if (max_id_ >= entries + kMaxIdHoles) {
    return Invalid(path, "token ids are not dense: id " + std::to_string(max_id_) + " among " +
                             std::to_string(entries) + " tokens");
  }
  const auto size = static_cast<size_t>(max_id_) + 1;
  token_bytes_.assign(size, std::string());
  special_.assign(size, 0);
  for (const auto& [token, id] : vocab_) {
    // Tokens outside the byte-level alphabet (rare, hand-added) stand for their own text.
    std::optional<std::string> bytes = byte_level::Decode(token);
    token_bytes_[id] = bytes ? std::move(*bytes) : token;
  }
  for (const AddedTokenMatcher::Token& t : added_) token_bytes_[t.id] = t.content;
  for (int32_t id : special_ids_) special_[id] = 1;
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(byte_level::Encode(std::string(1, static_cast<char>(b))));
    if (it == vocab_.end()) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "0x%02X", b);
      return Invalid(path, std::string("model.vocab lacks the byte-level token of byte ") + hex);
    }
    byte_ids_[b] = it->second;
  }
  // A token stands for its bytes of the normalized text (an added token that strips also for
  // whitespace, which the bound does not count); NFC shrinks text at most threefold (a Hangul
  // syllable from three 3-byte jamo).
  size_t longest = 1;
  for (const std::string& bytes : token_bytes_) longest = std::max(longest, bytes.size());
  max_text_bytes_per_token_ = longest * (nfc_ ? 3 : 1);
  added_matcher_ = AddedTokenMatcher(std::move(added_));
  return Status::Ok();
}

std::vector<int32_t> ByteLevelBpe::Encode(std::string_view text, bool add_special) const {
  std::vector<int32_t> ids;
  added_matcher_.Encode(
      text,
      [this](std::string_view plain, std::vector<int32_t>& out) { EncodeSegment(plain, out); },
      ids);
  return add_special ? WithSpecials(std::move(ids)) : ids;
}

void ByteLevelBpe::EncodeSegment(std::string_view text, std::vector<int32_t>& ids) const {
  std::vector<std::string> words;
  size_t pos = 0;
  while (pos < text.size()) {
    // The longest valid UTF-8 run goes through normalization and the regex; each invalid
    // subpart after it becomes a word of its own, so arbitrary bytes still round-trip.
    size_t end = pos;
    utf8::Decoded d{};
    while (end < text.size()) {
      d = utf8::DecodeAt(text, end);
      if (d.kind != utf8::Decoded::Kind::kValid) break;
      end += d.length;
    }
    if (end > pos) {
      const std::string_view run = text.substr(pos, end - pos);
      words.clear();
      if (nfc_ && !nfc::IsQuickNfc(run)) {
        pre_.Run(nfc::Normalize(run), words);
      } else {
        pre_.Run(run, words);
      }
      for (const std::string& w : words) EncodeWord(w, ids);
    }
    if (end < text.size()) {
      EncodeWord(text.substr(end, d.length), ids);
      end += d.length;
    }
    pos = end;
  }
}

void ByteLevelBpe::EncodeWord(std::string_view word, std::vector<int32_t>& ids) const {
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    MutexLock lock(&cache_mu_);
    auto it = cache_.find(std::string(word));
    if (it != cache_.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> out;
  if (ignore_merges_) {
    auto it = vocab_.find(byte_level::Encode(word));
    if (it != vocab_.end()) out.push_back(it->second);
  }
  if (out.empty()) MergeWord(word, out);
  ids.insert(ids.end(), out.begin(), out.end());
  if (cacheable) {
    MutexLock lock(&cache_mu_);
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(std::string(word), std::move(out));
  }
}

// Standard BPE: repeatedly apply the lowest-ranked merge among adjacent symbols (leftmost
// first on ties). A heap of candidate pairs plus a linked list of symbols keeps this
// O(n log n) even for very long words; stale heap entries are recognised and skipped.
void ByteLevelBpe::MergeWord(std::string_view word, std::vector<int32_t>& ids) const {
  struct Symbol {
    int32_t id;  // -1 once merged into its left neighbour
    int32_t prev, next;
  };
  struct Candidate {
    int32_t rank, left, left_id, right_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  const auto n = static_cast<int32_t>(word.size());
  std::vector<Symbol> symbols(n);
  for (int32_t i = 0; i < n; ++i) {
    symbols[i] = {byte_ids_[static_cast<unsigned char>(word[i])], i - 1, i + 1 < n ? i + 1 : -1};
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](int32_t left) {
    if (left < 0 || symbols[left].next < 0) return;
    const int32_t a = symbols[left].id, b = symbols[symbols[left].next].id;
    auto it = merges_.find(PairKey(a, b));
    if (it != merges_.end()) heap.push({it->second.rank, left, a, b});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& left = symbols[c.left];
    // A symbol's id only ever grows into a longer token, so matching ids mean the pair is
    // still exactly the one this candidate was made for.
    if (left.id != c.left_id || left.next < 0 || symbols[left.next].id != c.right_id) continue;
    Symbol& right = symbols[left.next];
    left.id = merges_.at(PairKey(c.left_id, c.right_id)).merged;
    right.id = -1;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = c.left;
    push(left.prev);
    push(c.left);
  }
  for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = symbols[i].next) ids.push_back(symbols[i].id);
}

std::optional<int32_t> ByteLevelBpe::TokenToId(std::string_view token) const {
  const std::string key(token);
  if (auto it = added_id_.find(key); it != added_id_.end()) return it->second;
  if (auto it = vocab_.find(key); it != vocab_.end()) return it->second;
  return std::nullopt;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> LoadByteLevelBpe(const json& file, const std::string& path) {
  if (!file.is_object()) return Invalid(path, "top level must be a JSON object");
  auto model = file.find("model");
  if (model == file.end() || !model->is_object()) {
    return Invalid(path, "missing \"model\" object");
  }
  const json& type = Get(*model, "type");
  if (!type.is_null() && type != "BPE") {
    return Status::Unimplemented(path + ": model type " + type.dump() + " is not supported");
  }
  if (Get(*model, "byte_fallback") == true) {
    return Status::Unimplemented(path +
                                 ": byte_fallback BPE (SentencePiece-style) is not "
                                 "supported; use tokenizer.model");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json& v = Get(*model, key);
    if (!v.is_null() && v != "") {
      return Status::Unimplemented(path + ": model." + key + " is not supported");
    }
  }
  auto bpe = std::make_unique<ByteLevelBpe>();
  PD_RETURN_IF_ERROR(bpe->LoadNormalizer(file, path));
  PD_RETURN_IF_ERROR(bpe->LoadPreTokenizer(file, path));
  PD_RETURN_IF_ERROR(bpe->LoadVocab(*model, path));
  PD_RETURN_IF_ERROR(bpe->LoadAddedTokens(file, path));
  PD_RETURN_IF_ERROR(bpe->LoadMerges(*model, path));
  bpe->LoadPostProcessor(file);
  PD_RETURN_IF_ERROR(bpe->FinishLoad(path));
  return std::unique_ptr<Tokenizer>(std::move(bpe));
}

}  // namespace pdserve
