#include "bench/serve_dataset.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <utility>

#include <fmt/format.h>

#include "tokenizer/tokenizer.h"

namespace pdserve::bench {
namespace {

using nlohmann::json;

constexpr auto kTokenizeTimeout = std::chrono::seconds(30);

// Plain words that every byte-level or SentencePiece vocabulary splits into few tokens.
constexpr const char* kWords[] = {
    "time",  "people", "year",   "way",     "day",    "thing",    "man",     "world",   "life",
    "hand",  "part",   "child",  "eye",     "woman",  "place",    "work",    "week",    "case",
    "point", "number", "group",  "problem", "fact",   "river",    "garden",  "window",  "stone",
    "light", "water",  "story",  "house",   "music",  "market",   "winter",  "summer",  "morning",
    "paper", "table",  "bridge", "forest",  "letter", "mountain", "city",    "road",    "friend",
    "open",  "small",  "large",  "quiet",   "bright", "early",    "late",    "simple",  "strong",
    "run",   "write",  "build",  "carry",   "listen", "follow",   "answer",  "travel",  "measure",
    "and",   "with",   "under",  "over",    "before", "after",    "between", "through", "about",
};

class LocalTokenizer : public PromptTokenizer {
 public:
  explicit LocalTokenizer(std::unique_ptr<Tokenizer> tokenizer)
      : tokenizer_(std::move(tokenizer)) {}
  Result<std::vector<int32_t>> Encode(const std::string& text) override {
    return tokenizer_->Encode(text, /*add_special=*/false);
  }
  Result<std::string> Decode(const std::vector<int32_t>& ids) override {
    return tokenizer_->Decode(ids, /*skip_special=*/false);
  }

 private:
  std::unique_ptr<Tokenizer> tokenizer_;
};

class RemoteTokenizer : public PromptTokenizer {
 public:
  RemoteTokenizer(ServerAddress server, std::string model)
      : server_(std::move(server)), model_(std::move(model)) {}
  Result<std::vector<int32_t>> Encode(const std::string& text) override {
    PD_ASSIGN_OR_RETURN(
        json answer, PostJson(server_, "/tokenize",
                              {{"model", model_}, {"prompt", text}, {"add_special_tokens", false}},
                              kTokenizeTimeout));
    const auto tokens = answer.find("tokens");
    if (tokens == answer.end() || !tokens->is_array()) {
      return Status::ProtocolError("/tokenize answered without a \"tokens\" array");
    }
    std::vector<int32_t> ids;
    for (const json& t : *tokens) {
      if (!t.is_number_integer()) return Status::ProtocolError("/tokenize: a token is no integer");
      ids.push_back(t.get<int32_t>());
    }
    return ids;
  }
  Result<std::string> Decode(const std::vector<int32_t>& ids) override {
    PD_ASSIGN_OR_RETURN(
        json answer,
        PostJson(server_, "/detokenize", {{"model", model_}, {"tokens", ids}}, kTokenizeTimeout));
    const auto prompt = answer.find("prompt");
    if (prompt == answer.end() || !prompt->is_string()) {
      return Status::ProtocolError("/detokenize answered without a \"prompt\" string");
    }
    return prompt->get<std::string>();
  }

 private:
  const ServerAddress server_;
  const std::string model_;
};

std::string RandomWords(int count, std::mt19937_64& rng) {
  std::uniform_int_distribution<size_t> pick(0, std::size(kWords) - 1);
  std::string text;
  for (int i = 0; i < count; ++i) {
    if (i > 0) text += ' ';
    text += kWords[pick(rng)];
  }
  return text;
}

// A prompt of `target` tokens: random words, cut at the target-th token, re-checked.
Result<SampleRequest> RandomPrompt(int target, std::mt19937_64& rng, PromptTokenizer& tokenizer) {
  std::string text = RandomWords(target, rng);
  PD_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer.Encode(text));
  while (static_cast<int>(ids.size()) < target) {
    text += ' ' + RandomWords(target, rng);
    PD_ASSIGN_OR_RETURN(ids, tokenizer.Encode(text));
  }
  // Decoding a cut sequence and encoding it again may merge differently at the cut; a few
  // rounds of trimming or padding with a word settle it.
  for (int attempt = 0; attempt < 8 && static_cast<int>(ids.size()) != target; ++attempt) {
    if (static_cast<int>(ids.size()) > target) {
      ids.resize(static_cast<size_t>(target));
      PD_ASSIGN_OR_RETURN(text, tokenizer.Decode(ids));
    } else {
      text += ' ' + RandomWords(1, rng);
    }
    PD_ASSIGN_OR_RETURN(ids, tokenizer.Encode(text));
  }
  return SampleRequest{text, static_cast<int>(ids.size()), 0};
}

}  // namespace

Result<std::unique_ptr<PromptTokenizer>> LocalPromptTokenizer(const std::string& dir) {
  auto tokenizer = Tokenizer::Load(dir);
  if (!tokenizer.ok()) return tokenizer.status().WithContext("--tokenizer " + dir);
  return std::unique_ptr<PromptTokenizer>(new LocalTokenizer(std::move(*tokenizer)));
}

std::unique_ptr<PromptTokenizer> RemotePromptTokenizer(ServerAddress server, std::string model) {
  return std::make_unique<RemoteTokenizer>(std::move(server), std::move(model));
}

Result<std::vector<SampleRequest>> RandomDataset(const RandomDatasetOptions& options,
                                                 PromptTokenizer& tokenizer) {
  if (options.input_len < 1 || options.output_len < 1) {
    return Status::InvalidArgument("--random-input-len and --random-output-len must be >= 1");
  }
  if (!(options.range_ratio >= 0 && options.range_ratio < 1)) {
    return Status::InvalidArgument("--random-range-ratio must be in [0, 1)");
  }
  auto bounds = [&](int len) {
    const int lo = std::max(1, static_cast<int>(std::floor(len * (1 - options.range_ratio))));
    const int hi = std::max(lo, static_cast<int>(std::ceil(len * (1 + options.range_ratio))));
    return std::uniform_int_distribution<int>(lo, hi);
  };
  std::mt19937_64 rng(options.seed);
  auto input_dist = bounds(options.input_len);
  auto output_dist = bounds(options.output_len);
  std::vector<SampleRequest> requests;
  for (int i = 0; i < options.num_prompts; ++i) {
    const int input_len = input_dist(rng);
    const int output_len = output_dist(rng);
    PD_ASSIGN_OR_RETURN(SampleRequest request, RandomPrompt(input_len, rng, tokenizer));
    request.output_len = output_len;
    requests.push_back(std::move(request));
  }
  return requests;
}

Result<std::vector<SampleRequest>> JsonlDataset(const std::string& path, int num_prompts,
                                                PromptTokenizer* tokenizer) {
  std::ifstream in(path);
  if (!in) return Status::NotFound("--dataset-path " + path + ": cannot open");
  std::vector<SampleRequest> lines;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    const auto where = [&] { return fmt::format("{}:{}", path, number); };
    if (j.is_discarded() || !j.is_object()) {
      return Status::InvalidArgument(where() + ": not a JSON object");
    }
    const auto prompt = j.find("prompt");
    const auto output_len = j.find("output_len");
    if (prompt == j.end() || !prompt->is_string() || prompt->get<std::string>().empty()) {
      return Status::InvalidArgument(where() + ": needs a non-empty string \"prompt\"");
    }
    if (output_len == j.end() || !output_len->is_number_integer() ||
        output_len->get<int64_t>() < 1 || output_len->get<int64_t>() > (1 << 24)) {
      return Status::InvalidArgument(where() + ": needs an integer \"output_len\" >= 1");
    }
    SampleRequest request{prompt->get<std::string>(), 0, output_len->get<int>()};
    if (const auto len = j.find("prompt_len"); len != j.end()) {
      if (!len->is_number_integer() || len->get<int64_t>() < 1 || len->get<int64_t>() > (1 << 24)) {
        return Status::InvalidArgument(where() + ": \"prompt_len\" must be an integer >= 1");
      }
      request.prompt_len = len->get<int>();
    } else if (tokenizer != nullptr) {
      PD_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer->Encode(request.prompt));
      request.prompt_len = static_cast<int>(ids.size());
    }
    lines.push_back(std::move(request));
    if (static_cast<int>(lines.size()) == num_prompts) break;
  }
  if (lines.empty()) return Status::InvalidArgument("--dataset-path " + path + ": no requests");
  std::vector<SampleRequest> requests;
  for (int i = 0; i < num_prompts; ++i) requests.push_back(lines[i % lines.size()]);
  return requests;
}

}  // namespace pdserve::bench
