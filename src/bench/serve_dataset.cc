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
  return SampleRequest{.prompt = text, .prompt_len = static_cast<int>(ids.size())};
}

// A text and its exact tokens, the base that AppendWords extends.
struct TokenizedText {
  std::string text;
  std::vector<int32_t> ids;
};

bool StartsWith(const std::vector<int32_t>& ids, const std::vector<int32_t>& prefix) {
  return ids.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), ids.begin());
}

// `base` extended by `count` tokens of random words: the result encodes to base's tokens
// followed by exactly `count` more. Words are appended after a space (a word boundary for
// byte-level and SentencePiece vocabularies alike), the surplus cut off and the result checked
// by encoding it again; a few fresh draws settle a cut that merges differently.
Result<TokenizedText> AppendWords(const TokenizedText& base, int count, std::mt19937_64& rng,
                                  PromptTokenizer& tokenizer) {
  const size_t target = base.ids.size() + static_cast<size_t>(count);
  for (int attempt = 0; attempt < 16; ++attempt) {
    TokenizedText next;
    if (base.ids.empty()) {
      PD_ASSIGN_OR_RETURN(SampleRequest r, RandomPrompt(count, rng, tokenizer));
      next.text = std::move(r.prompt);
    } else {
      next.text = base.text + ' ' + RandomWords(count, rng);
      PD_ASSIGN_OR_RETURN(next.ids, tokenizer.Encode(next.text));
      while (next.ids.size() < target) {
        next.text += ' ' + RandomWords(count, rng);
        PD_ASSIGN_OR_RETURN(next.ids, tokenizer.Encode(next.text));
      }
      if (next.ids.size() > target && StartsWith(next.ids, base.ids)) {
        // The base's text followed by the decoded tail: the base stays byte for byte.
        const std::vector<int32_t> tail(next.ids.begin() + static_cast<ptrdiff_t>(base.ids.size()),
                                        next.ids.begin() + static_cast<ptrdiff_t>(target));
        PD_ASSIGN_OR_RETURN(std::string tail_text, tokenizer.Decode(tail));
        std::string joined = base.text + tail_text;
        // A SentencePiece decoder drops the leading space of a piece sequence; put it back.
        if (!tail_text.empty() && tail_text.front() != ' ') joined = base.text + ' ' + tail_text;
        next.text = std::move(joined);
      }
    }
    PD_ASSIGN_OR_RETURN(next.ids, tokenizer.Encode(next.text));
    if (next.ids.size() == target && StartsWith(next.ids, base.ids)) return next;
  }
  return Status::InvalidArgument(
      fmt::format("could not extend a prompt of {} tokens by exactly {} tokens with this tokenizer",
                  base.ids.size(), count));
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

Result<std::vector<SampleRequest>> SharedPrefixDataset(const SharedPrefixDatasetOptions& options,
                                                       PromptTokenizer& tokenizer) {
  if (options.prefix_len < 1 || options.suffix_len < 1 || options.output_len < 1) {
    return Status::InvalidArgument(
        "--prefix-len, --suffix-len and --random-output-len must be >= 1");
  }
  if (options.num_prefixes < 1 || options.num_prefixes > options.num_prompts) {
    return Status::InvalidArgument("--num-prefixes must be in [1, --num-prompts]");
  }
  std::mt19937_64 rng(options.seed);
  std::vector<TokenizedText> prefixes;
  for (int p = 0; p < options.num_prefixes; ++p) {
    PD_ASSIGN_OR_RETURN(TokenizedText prefix,
                        AppendWords(TokenizedText{}, options.prefix_len, rng, tokenizer));
    prefixes.push_back(std::move(prefix));
  }
  std::vector<SampleRequest> requests;
  for (int i = 0; i < options.num_prompts; ++i) {
    PD_ASSIGN_OR_RETURN(TokenizedText prompt,
                        AppendWords(prefixes[static_cast<size_t>(i % options.num_prefixes)],
                                    options.suffix_len, rng, tokenizer));
    requests.push_back(SampleRequest{.prompt = std::move(prompt.text),
                                     .prompt_len = static_cast<int>(prompt.ids.size()),
                                     .output_len = options.output_len});
  }
  return requests;
}

Result<std::vector<SampleRequest>> MultiTurnDataset(const MultiTurnDatasetOptions& options,
                                                    PromptTokenizer& tokenizer) {
  if (options.num_conversations < 1 || options.num_turns < 1) {
    return Status::InvalidArgument("--num-conversations and --num-turns must be >= 1");
  }
  if (options.system_prompt_len < 1 || options.user_len < 1 || options.answer_len < 1 ||
      options.output_len < 1) {
    return Status::InvalidArgument(
        "--system-prompt-len, --user-len, --answer-len and --random-output-len must be >= 1");
  }
  std::mt19937_64 rng(options.seed);
  PD_ASSIGN_OR_RETURN(const TokenizedText system,
                      AppendWords(TokenizedText{}, options.system_prompt_len, rng, tokenizer));
  std::vector<SampleRequest> requests;
  for (int c = 0; c < options.num_conversations; ++c) {
    TokenizedText history = system;
    for (int turn = 1; turn <= options.num_turns; ++turn) {
      if (turn > 1) {
        PD_ASSIGN_OR_RETURN(history, AppendWords(history, options.answer_len, rng, tokenizer));
      }
      PD_ASSIGN_OR_RETURN(history, AppendWords(history, options.user_len, rng, tokenizer));
      requests.push_back(SampleRequest{.prompt = history.text,
                                       .prompt_len = static_cast<int>(history.ids.size()),
                                       .output_len = options.output_len,
                                       .conversation = c,
                                       .turn = turn});
    }
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
    SampleRequest request{.prompt = prompt->get<std::string>(),
                          .output_len = output_len->get<int>()};
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
