// `pdserve bench quality`: the quality of the 8-bit weight formats against BF16 weights of the
// same checkpoint (bench/weights_quality.h), one table row per format.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench/weights_quality.h"
#include "cli/commands.h"
#include "cli/model_flags.h"
#include "common/logging.h"
#include "kernels/dispatch.h"

namespace pdserve::cli {
namespace {

// The text every format is measured over (a children's story, the register stories260K was
// trained on); its first tokens also seed the greedy prompts.
constexpr const char* kQualityText =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
    "park with her friends. One day, she saw a big red ball under a tree. She ran to the ball "
    "and picked it up. It was soft and round. Lily wanted to share the ball with her friend Tom. "
    "She looked for Tom everywhere, but she could not find him. Then she heard a sound behind "
    "the bushes. It was Tom! He was sad because he had lost his toy car. Lily said, \"Don't be "
    "sad, Tom. We can play with my new ball.\" Tom smiled and they played together all day. "
    "When the sun went down, their mom called them home. Lily gave Tom a big hug and said, "
    "\"Thank you for playing with me.\" Tom said, \"You are my best friend.\" The next morning, "
    "Lily woke up early. She put on her blue dress and her shoes. She went to the kitchen and "
    "ate some bread with jam. Her dad asked her what she wanted to do today. Lily said she "
    "wanted to go to the lake to see the ducks. They walked to the lake and threw bread to the "
    "ducks. The ducks were happy and made funny noises. Lily laughed and laughed.";

struct BenchQualityFlags {
  ModelFlags model;
  std::string formats = "fp8,int8";
  int prompts = 4;
  int tokens = 256;              // greedy continuation of each prompt
  int prompt_len = 16;           // tokens of each prompt, taken from the text
  int text_tokens = 256;         // tokens of the text the KL is measured over
  bool compare_lm_head = false;  // each format twice: lm_head bf16 and int8
  std::string kernels;
};

// The model with its linear layers in `format` and its output matrix in `head` (nullopt: auto).
Result<ModelDir> LoadIn(const ModelFlags& flags, std::optional<DType> format,
                        std::optional<DType> head) {
  PD_ASSIGN_OR_RETURN(ModelDirOptions options, LoadOptionsFromFlags(flags));
  options.weight_format = format;
  options.head_format = head;
  return LoadModelDir(flags.model, options);
}

int RunBenchQuality(const BenchQualityFlags& f) {
  if (Status s =
          f.kernels.empty() ? kernels::SelectPathFromEnvironment() : kernels::SelectPath(f.kernels);
      !s.ok()) {
    return Fail(s.ToString());
  }
  std::vector<DType> formats;
  std::stringstream list(f.formats);
  for (std::string item; std::getline(list, item, ',');) {
    const std::optional<DType> t = ParseDTypeFlag(item);
    if (!t.has_value() || (*t != DType::kF8E4M3 && *t != DType::kI8 && *t != DType::kBF16)) {
      return Fail("--formats " + f.formats + ": each must be bf16, fp8 or int8");
    }
    formats.push_back(*t);
  }
  // The heads each format is measured with: --lm-head's (auto unless given), or both.
  std::vector<std::optional<DType>> heads = {
      f.model.lm_head == "auto" ? std::nullopt : ParseDTypeFlag(f.model.lm_head)};
  if (f.compare_lm_head) heads = {DType::kBF16, DType::kI8};
  PD_ASSIGN_OR_RETURN_CLI(ModelDir reference, LoadIn(f.model, DType::kBF16, DType::kBF16));
  if (reference.tokenizer == nullptr) return Fail("the model has no tokenizer");
  const std::vector<int32_t> all = reference.tokenizer->Encode(kQualityText, true);
  bench::WeightsQualityOptions options;
  options.continuation = f.tokens;
  const size_t text = std::min<size_t>(all.size(), static_cast<size_t>(f.text_tokens));
  options.text.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(text));
  // Prompts start at spread offsets of the text.
  for (int i = 0; i < f.prompts; ++i) {
    const size_t begin = all.size() > static_cast<size_t>(f.prompt_len)
                             ? (all.size() - f.prompt_len) * i / std::max(1, f.prompts)
                             : 0;
    const size_t end = std::min(all.size(), begin + f.prompt_len);
    options.prompts.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(begin),
                                 all.begin() + static_cast<std::ptrdiff_t>(end));
  }
  std::printf(
      "kernels: %s\nmodel %s; reference: bf16 weights (--weights bf16 --lm-head bf16); %d "
      "prompts of %d tokens "
      "continued greedily for %d tokens; KL(bf16 || format) of the next-token distributions "
      "over %zu tokens of text\n\n",
      kernels::DescribeSelection().c_str(), f.model.model.c_str(), f.prompts, f.prompt_len,
      f.tokens, options.text.size());
  std::printf(
      "| weights | lm_head | weight bytes | lm_head bytes | greedy: identical prefix | greedy: "
      "tokens equal | mean KL (nats) | max KL | top-1 agreement |\n"
      "|---|---|---|---|---|---|---|---|---|\n");
  for (DType format : formats) {
    for (std::optional<DType> head : heads) {
      PD_ASSIGN_OR_RETURN_CLI(ModelDir candidate, LoadIn(f.model, format, head));
      PD_ASSIGN_OR_RETURN_CLI(
          bench::WeightsQuality q,
          bench::CompareWeights(*reference.transformer, *candidate.transformer, options));
      const Transformer& t = *candidate.transformer;
      std::printf("| %s | %s | %zu | %zu | %.1f%% | %.1f%% | %.2e | %.2e | %.1f%% |\n",
                  std::string(DTypeFlagName(format)).c_str(),
                  std::string(DTypeFlagName(t.head_dtype())).c_str(), t.WeightBytes(),
                  t.HeadWeightBytes(), 100 * q.identical_prefix, 100 * q.tokens_equal, q.mean_kl,
                  q.max_kl, 100 * q.top1_agreement);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

void AddBenchQualityCommand(CLI::App& bench, int* exit_code) {
  auto flags = std::make_shared<BenchQualityFlags>();
  CLI::App* cmd = bench.add_subcommand(
      "quality", "Greedy agreement and KL divergence of 8-bit weights against bf16");
  AddModelFlags(cmd, &flags->model);
  cmd->add_option("--formats", flags->formats, "Weight formats to compare with bf16")
      ->capture_default_str();
  cmd->add_option("--prompts", flags->prompts, "Greedy prompts")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->add_option("--tokens", flags->tokens, "Greedy tokens after each prompt")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--prompt-len", flags->prompt_len, "Tokens of each prompt")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--text-tokens", flags->text_tokens, "Tokens of text for the KL")
      ->check(CLI::Range(2, 1 << 20))
      ->capture_default_str();
  cmd->add_flag("--compare-lm-head", flags->compare_lm_head,
                "Measure each format twice: with the lm_head in bf16 and in int8 (else as "
                "--lm-head says)");
  cmd->add_option("--kernels", flags->kernels, "Kernel path (as bench engine's)");
  cmd->callback([flags, exit_code] { *exit_code = RunBenchQuality(*flags); });
}

}  // namespace pdserve::cli
