// WriteSyntheticTokenizer: a byte-level BPE tokenizer.json for synthetic models. Merges are
// first learned by plain BPE training on a small built-in English text (so common words get
// their own ids), then filled up to the requested size with seeded random merges of existing
// tokens. Every merge concatenates two existing tokens, so every id decodes to bytes and any
// text round-trips.
#include <algorithm>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"

namespace pdserve {
namespace {

// The Qwen2 pre-tokenizer pattern, so that synthetic and real tokenizers take the same path.
constexpr const char* kPreTokenizerRegex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

constexpr const char* kSpecialTokens[] = {"<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>",
                                          "<|im_end|>"};
constexpr int32_t kNumSpecial = 4;
constexpr int32_t kMinVocab = 300;
constexpr int32_t kMaxVocab = 1 << 22;
// Learned merges stop here (or when no pair occurs twice); the rest are random.
constexpr int32_t kMaxTrainedMerges = 2000;
// Random merges keep tokens short, as real vocabularies do.
constexpr size_t kMaxRandomTokenBytes = 16;

constexpr const char* kChatTemplate =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";

// Built-in training text: everyday English, so merges resemble those of a real vocabulary.
constexpr const char* kTrainingText =
    "Once upon a time there was a little town by the sea. The people of the town worked hard "
    "every day, and in the evening they sat together and told stories about the old days. "
    "The children liked to play near the water, where the boats came in with fish and bread. "
    "One morning a young girl named Anna found a small box on the beach. She opened it and saw "
    "a letter inside. The letter said that a ship would come back to the town after many years. "
    "Anna ran home to tell her mother, and her mother told the whole town. Everyone was happy, "
    "because they had been waiting for a long time. They cleaned the streets, they cooked food, "
    "and they made music. When the ship finally arrived, the sailors were tired but glad to be "
    "home. They brought gifts from other countries: books, tools, cloth and new seeds for the "
    "fields. The town grew larger and the people learned new things. Today the story of the "
    "letter is still told to the children, who listen with their eyes wide open. "
    "In the world of computers, a program reads the input, processes the data and writes the "
    "output. A server answers requests from many clients at the same time. It should be fast, "
    "correct and simple to use. The model generates one token after another, and each token is "
    "a small piece of text. We measure the number of tokens per second and the time to the "
    "first token. Engineers test their systems carefully, because small errors can become "
    "large problems when the system is running for a long time with real users. "
    "Numbers such as 1, 2, 3, 10, 42, 100 and 2024 appear in text, as do questions like: "
    "what is it? where are you going? why not? It's a good day, isn't it? I'm sure we'll see.";

// Splits the training text into words the way the pre-tokenizer roughly would: an optional
// leading space followed by letters, or single other characters. Good enough for training.
std::map<std::string, int> CountTrainingWords() {
  std::map<std::string, int> counts;
  const std::string_view text = kTrainingText;
  auto is_letter = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
  for (size_t i = 0; i < text.size();) {
    size_t j = i;
    if (text[j] == ' ' && j + 1 < text.size() && is_letter(text[j + 1])) ++j;
    if (is_letter(text[j])) {
      while (j < text.size() && is_letter(text[j])) ++j;
    } else {
      ++j;
    }
    ++counts[std::string(text.substr(i, j - i))];
    i = j;
  }
  return counts;
}

struct MergeList {
  std::vector<std::string> tokens;  // alphabet form, index = id
  std::vector<size_t> token_bytes;  // raw byte length of each token
  std::vector<std::pair<int32_t, int32_t>> merges;
  std::unordered_set<std::string> known;

  void Add(std::string token, size_t bytes) {
    known.insert(token);
    tokens.push_back(std::move(token));
    token_bytes.push_back(bytes);
  }
  void Merge(int32_t a, int32_t b) {
    merges.emplace_back(a, b);
    Add(tokens[a] + tokens[b], token_bytes[a] + token_bytes[b]);
  }
};

// Classic BPE training: repeatedly merge the most frequent adjacent pair (ties: smallest ids).
void TrainMerges(int32_t budget, MergeList& list) {
  std::vector<std::pair<std::vector<int32_t>, int>> words;
  for (const auto& [word, count] : CountTrainingWords()) {
    std::vector<int32_t> ids;
    for (char c : word) ids.push_back(static_cast<unsigned char>(c));
    words.emplace_back(std::move(ids), count);
  }
  for (int32_t step = 0; step < budget; ++step) {
    std::map<std::pair<int32_t, int32_t>, int> pair_counts;
    for (const auto& [ids, count] : words) {
      for (size_t i = 0; i + 1 < ids.size(); ++i) pair_counts[{ids[i], ids[i + 1]}] += count;
    }
    std::pair<int32_t, int32_t> best{-1, -1};
    int best_count = 1;  // a pair must occur at least twice to be worth a merge
    for (const auto& [pair, count] : pair_counts) {
      if (count > best_count) best = pair, best_count = count;
    }
    if (best.first < 0) return;
    const auto merged = static_cast<int32_t>(list.tokens.size());
    list.Merge(best.first, best.second);
    for (auto& [ids, count] : words) {
      std::vector<int32_t> out;
      for (size_t i = 0; i < ids.size(); ++i) {
        if (i + 1 < ids.size() && ids[i] == best.first && ids[i + 1] == best.second) {
          out.push_back(merged);
          ++i;
        } else {
          out.push_back(ids[i]);
        }
      }
      ids = std::move(out);
    }
  }
}

// SplitMix64: a tiny portable generator, so the same seed gives the same file everywhere.
uint64_t NextRandom(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

Status FillRandomMerges(size_t target_tokens, uint64_t seed, MergeList& list) {
  uint64_t state = seed;
  size_t attempts = 0;
  const size_t max_attempts = 64 * target_tokens + 1000000;
  while (list.tokens.size() < target_tokens) {
    if (++attempts > max_attempts) {
      return Status::Internal("synthetic tokenizer: could not find enough distinct merges");
    }
    const size_t n = list.tokens.size();
    const auto a = static_cast<int32_t>(NextRandom(state) % n);
    const auto b = static_cast<int32_t>(NextRandom(state) % n);
    if (list.token_bytes[a] + list.token_bytes[b] > kMaxRandomTokenBytes) continue;
    if (list.known.count(list.tokens[a] + list.tokens[b]) != 0) continue;
    list.Merge(a, b);
  }
  return Status::Ok();
}

nlohmann::json TokenizerJson(const MergeList& list, int32_t first_special) {
  using nlohmann::json;
  json added = json::array();
  for (int32_t i = 0; i < kNumSpecial; ++i) {
    added.push_back({{"id", first_special + i},
                     {"content", kSpecialTokens[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  json vocab = json::object();
  for (size_t id = 0; id < list.tokens.size(); ++id) vocab[list.tokens[id]] = id;
  json merges = json::array();
  for (const auto& [a, b] : list.merges) merges.push_back({list.tokens[a], list.tokens[b]});
  const std::string bos = kSpecialTokens[0];
  json post = {
      {"type", "TemplateProcessing"},
      {"single",
       {{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"pair",
       {{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
        {{"SpecialToken", {{"id", bos}, {"type_id", 1}}}},
        {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
      {"special_tokens", {{bos, {{"id", bos}, {"ids", {first_special}}, {"tokens", {bos}}}}}}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", std::move(added)},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "Sequence"},
            {"pretokenizers",
             {{{"type", "Split"},
               {"pattern", {{"Regex", kPreTokenizerRegex}}},
               {"behavior", "Isolated"},
               {"invert", false}},
              {{"type", "ByteLevel"},
               {"add_prefix_space", false},
               {"trim_offsets", true},
               {"use_regex", false}}}}}},
          {"post_processor", std::move(post)},
          {"decoder",
           {{"type", "ByteLevel"},
            {"add_prefix_space", true},
            {"trim_offsets", true},
            {"use_regex", true}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", false},
            {"vocab", std::move(vocab)},
            {"merges", std::move(merges)}}}};
}

nlohmann::json TokenizerConfigJson() {
  return {{"tokenizer_class", "PreTrainedTokenizerFast"},
          {"bos_token", kSpecialTokens[0]},
          {"eos_token", kSpecialTokens[1]},
          {"add_bos_token", true},
          {"add_eos_token", false},
          {"model_max_length", 131072},
          {"chat_template", kChatTemplate}};
}

Status WriteJsonFile(const std::filesystem::path& path, const nlohmann::json& json) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return Status::IoError("cannot create " + path.string());
  out << json.dump();
  out.close();
  if (!out) return Status::IoError("cannot write " + path.string());
  return Status::Ok();
}

}  // namespace

Status WriteSyntheticTokenizer(const std::string& model_dir, int32_t vocab_size, uint64_t seed) {
  if (vocab_size < kMinVocab || vocab_size > kMaxVocab) {
    return Status::InvalidArgument("synthetic tokenizer: vocab_size " + std::to_string(vocab_size) +
                                   " is outside [" + std::to_string(kMinVocab) + ", " +
                                   std::to_string(kMaxVocab) + "]");
  }
  const int32_t first_special = vocab_size - kNumSpecial;
  MergeList list;
  list.tokens.reserve(first_special);
  for (int b = 0; b < 256; ++b) {
    list.Add(byte_level::Encode(std::string(1, static_cast<char>(b))), 1);
  }
  TrainMerges(std::min(kMaxTrainedMerges, first_special - 256), list);
  PD_RETURN_IF_ERROR(FillRandomMerges(first_special, seed, list));

  std::error_code ec;
  std::filesystem::create_directories(model_dir, ec);
  if (ec) return Status::IoError("cannot create directory " + model_dir + ": " + ec.message());
  const std::filesystem::path dir(model_dir);
  try {
    PD_RETURN_IF_ERROR(WriteJsonFile(dir / "tokenizer.json", TokenizerJson(list, first_special)));
    return WriteJsonFile(dir / "tokenizer_config.json", TokenizerConfigJson());
  } catch (const std::exception& e) {  // nlohmann::json or allocation failures
    return Status::Internal(std::string("synthetic tokenizer: ") + e.what());
  }
}

}  // namespace pdserve
