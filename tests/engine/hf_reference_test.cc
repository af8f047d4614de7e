// The engine against tests/reference/hf_reference.py, the independent float64 forward pass in
// Python/numpy written from the Hugging Face modeling code (not from this C++). For each preset,
// 5 prompts x 24 greedy tokens: the reference's greedy ids, its top-20 log-probabilities at every
// step and, for MoE models, the experts each MoE layer chose for each position.
//
// Matrices held in F32 (the checkpoint is BF16; widening is exact): the engine then differs from
// float64 only by F32 rounding, ~1e-6 relative on logits of magnitude ~10, so log-probabilities
// agree to 1e-3 with room to spare and near-ties of the router (F32 logits) do not flip. The
// BF16 path rounds every activation to 8 bits of mantissa before each product (~4e-3 relative),
// so against float64 it is held to looser bounds: its greedy ids may leave the reference's only
// where the reference's best two are within 0.05 nats, and log-probabilities within 0.1.
#include <climits>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/subprocess.h"
#include "model/model_dir.h"
#include "testing/test_models.h"
#include "testing/test_paths.h"

namespace pdserve {
namespace {

using json = nlohmann::json;

constexpr int kTokens = 24;
constexpr int kTop = 20;

const std::vector<std::vector<int32_t>>& Prompts() {
  static const std::vector<std::vector<int32_t>> prompts = {
      {1}, {1, 2, 3}, {17, 400, 5, 911, 23, 8, 640}, {1000, 20}, {7, 7, 7, 7, 300, 301, 302, 5}};
  return prompts;
}

// Runs the reference on `dir`; its JSON, or a failure naming what went wrong.
Result<json> RunReference(const std::string& dir) {
  if (std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
    return Status::FailedPrecondition(
        "/usr/bin/python3 with numpy is missing (scripts/install-deps.sh installs python3-numpy)");
  }
  const std::string out = testing::MakeTempDir("pdserve_hfref_") + "/reference.json";
  SubprocessOptions options;
  options.argv = {"/usr/bin/python3",
                  PDSERVE_HF_REFERENCE,
                  "--model",
                  dir,
                  "--tokens",
                  std::to_string(kTokens),
                  "--top",
                  std::to_string(kTop),
                  "--out",
                  out};
  for (const auto& p : Prompts()) {
    std::string ids;
    for (int32_t t : p) ids += (ids.empty() ? "" : ",") + std::to_string(t);
    options.argv.push_back("--prompt-ids");
    options.argv.push_back(ids);
  }
  PD_ASSIGN_OR_RETURN(Subprocess child, Subprocess::Spawn(options));
  PD_ASSIGN_OR_RETURN(ExitStatus status, child.WaitFor(Deadline::AfterMs(300'000)));
  if (!status.success()) return Status::Internal("hf_reference.py " + status.ToString());
  std::ifstream in(out);
  std::stringstream text;
  text << in.rdbuf();
  std::filesystem::remove_all(std::filesystem::path(out).parent_path());
  return json::parse(text.str());
}

// What the engine computed for one prompt fed the reference's greedy tokens: the log-softmax
// of each step's logits and the routing of every position (layer -> [position][k]).
struct EngineRun {
  std::vector<std::vector<double>> logprobs;  // [kTokens][vocab]
  std::map<int, std::vector<int32_t>> experts;
};

EngineRun RunEngine(Transformer& model, const std::vector<int32_t>& prompt,
                    const std::vector<int32_t>& greedy) {
  EngineRun run;
  constexpr int kPageTokens = 8;
  std::vector<int32_t> tokens = prompt;
  tokens.insert(tokens.end(), greedy.begin(), greedy.end());
  const int pages = static_cast<int>((tokens.size() + kPageTokens - 1) / kPageTokens);
  auto cache = KvCache::Create(model.MakeKvLayout(pages, kPageTokens));
  EXPECT_TRUE(cache.ok());
  std::vector<PageId> table(pages);
  for (int i = 0; i < pages; ++i) table[i] = i;
  RoutingTrace trace;
  model.set_routing_trace(&trace);
  size_t done = 0;
  for (int step = 0; step < kTokens; ++step) {
    const size_t end = prompt.size() + step;  // feed up to (not including) greedy[step]
    SequenceChunk c{.tokens = std::span<const int32_t>(tokens).subspan(done, end - done),
                    .start = static_cast<int64_t>(done),
                    .pages = table,
                    .want_logits = true};
    std::vector<float> logits;
    Status s = model.Forward(std::span<const SequenceChunk>(&c, 1), **cache, &logits);
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (!s.ok()) break;
    for (const RoutingTrace::Layer& l : trace.layers) {
      auto& e = run.experts[l.layer];
      e.insert(e.end(), l.experts.begin(), l.experts.end());
    }
    double top = -INFINITY, sum = 0;
    for (float v : logits) top = std::max(top, static_cast<double>(v));
    for (float v : logits) sum += std::exp(v - top);
    std::vector<double>& lp = run.logprobs.emplace_back(logits.size());
    for (size_t i = 0; i < logits.size(); ++i) lp[i] = logits[i] - top - std::log(sum);
    done = end;
  }
  model.set_routing_trace(nullptr);
  return run;
}

struct Bounds {
  DType weights;
  double logprob;   // |engine - reference| for each of the reference's top 20
  double near_tie;  // greedy may differ only where the reference's best two are this close
};

class HfReferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfReferenceTest, EngineMatchesTheFloat64Reference) {
  // "PRESET" (a BF16 checkpoint) or "PRESET@fp8" (DeepSeek's FP8 format: the second run keeps
  // the matrices FP8 in memory, the first dequantises them at load).
  const std::string param = GetParam();
  const bool fp8 = param.ends_with("@fp8");
  const std::string preset = param.substr(0, param.find('@'));
  const std::string dir = testing::SyntheticModelDir(preset, fp8 ? DType::kF8E4M3 : DType::kBF16);
  Result<json> reference = RunReference(dir);
  ASSERT_TRUE(reference.ok()) << "REFERENCE NOT RUN: " << reference.status().ToString();
  const json& cases = (*reference)["prompts"];
  ASSERT_EQ(cases.size(), Prompts().size());

  for (Bounds bounds : {Bounds{DType::kF32, 1e-3, 0.0}, Bounds{DType::kBF16, 0.1, 0.05}}) {
    SCOPED_TRACE(bounds.weights == DType::kF32 ? "F32 matrices"
                 : fp8                         ? "FP8 matrices"
                                               : "BF16 matrices");
    ModelDirOptions options;
    options.load_tokenizer = false;
    options.weight_dtype = bounds.weights;
    if (fp8 && bounds.weights == DType::kBF16) options.weight_dtype.reset();  // FP8 kept
    options.transformer.threads = 1;
    auto model = LoadModelDir(dir, options);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    int routing_compared = 0, routing_differs = 0;
    for (size_t p = 0; p < Prompts().size(); ++p) {
      SCOPED_TRACE("prompt " + std::to_string(p));
      const json& want = cases[p];
      const auto greedy = want["greedy"].get<std::vector<int32_t>>();
      ASSERT_EQ(greedy.size(), static_cast<size_t>(kTokens));
      EngineRun got = RunEngine(*model->transformer, Prompts()[p], greedy);
      ASSERT_EQ(got.logprobs.size(), static_cast<size_t>(kTokens));
      // Routing: the reference records every position it ran (all but the last token).
      int64_t first_flip = INT64_MAX;  // the first position where a layer chose otherwise
      for (const json& r : want["routing"]) {
        const int layer = r["layer"].get<int>();
        const int position = r["position"].get<int>();
        const auto experts = r["experts"].get<std::vector<int32_t>>();
        const auto& mine = got.experts[layer];
        const size_t k = experts.size();
        ASSERT_LE((position + 1) * k, mine.size()) << "layer " << layer;
        const std::vector<int32_t> chosen(mine.begin() + position * k,
                                          mine.begin() + (position + 1) * k);
        ++routing_compared;
        if (chosen != experts) {
          ++routing_differs;
          first_flip = std::min<int64_t>(first_flip, position);
        }
        if (bounds.weights == DType::kF32) {
          EXPECT_EQ(chosen, experts) << "layer " << layer << " position " << position;
        }
      }
      for (int step = 0; step < kTokens; ++step) {
        // A flipped expert (BF16 only) is a discrete change from its position on: the
        // log-probabilities are compared up to it.
        if (static_cast<int64_t>(Prompts()[p].size()) + step - 1 >= first_flip) break;
        const json& top = want["steps"][step]["top"];
        ASSERT_EQ(top.size(), static_cast<size_t>(kTop));
        const std::vector<double>& lp = got.logprobs[step];
        const auto argmax =
            static_cast<int32_t>(std::max_element(lp.begin(), lp.end()) - lp.begin());
        const double gap = top[0][1].get<double>() - top[1][1].get<double>();
        if (gap >= bounds.near_tie) {
          EXPECT_EQ(argmax, greedy[step]) << "step " << step << " (reference gap " << gap << ")";
        }
        for (const json& entry : top) {
          const int id = entry[0].get<int>();
          EXPECT_NEAR(lp[id], entry[1].get<double>(), bounds.logprob)
              << "step " << step << " token " << id;
        }
      }
    }
    if (bounds.weights == DType::kBF16 && routing_compared > 0) {
      // BF16 rounding reaches the router's input through every product before it; a flip
      // needs a near-tie there. A broken router or grouping would differ nearly everywhere.
      std::printf("%s, %s matrices: %d of %d routing choices differ from float64\n", param.c_str(),
                  fp8 ? "FP8" : "BF16", routing_differs, routing_compared);
      EXPECT_LE(routing_differs * 10, routing_compared)
          << routing_differs << " of " << routing_compared << " routing choices differ";
    }
    if (model->config.moe.num_experts > 0) {
      EXPECT_GT(routing_compared, 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, HfReferenceTest,
                         ::testing::Values("tiny", "tiny-qwen2", "tiny-qwen3", "tiny-mistral",
                                           "tiny-llama3", "qwen3-moe-tiny", "deepseek-v3-tiny",
                                           "deepseek-v2-lite-tiny", "qwen3-moe-tiny@fp8",
                                           "deepseek-v3-tiny@fp8"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& ch : name) {
                             if (ch == '-' || ch == '@') ch = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace pdserve
