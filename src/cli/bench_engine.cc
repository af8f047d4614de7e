// `pdserve bench engine`: prefill and decode throughput of the forward pass, each beside the
// ceiling measured in the same run (oneDNN bf16 GEMM rate for prefill; memory bandwidth over
// the bytes of weights read per step for decode) and the ratio to it. Each figure is measured
// --repeats times, every time right after its own ceiling; the medians are printed.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/model_flags.h"
#include "model/ceilings.h"

namespace pdserve::cli {
namespace {

struct BenchEngineFlags {
  ModelFlags model;
  std::string batches = "1,8,32";
  int prompt_len = 512;
  int decode_steps = 8;
  int repeats = 3;
};

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// Multiply-adds per token of every matrix in the layers (attention scores excluded).
double LayerMacsPerToken(const ModelConfig& c) {
  const double hd = c.head_dim;
  const double qkv = (c.num_heads + 2.0 * c.num_kv_heads) * hd * c.hidden_size;
  const double o = c.num_heads * hd * c.hidden_size;
  const double mlp = 3.0 * c.intermediate_size * c.hidden_size;
  return c.num_layers * (qkv + o + mlp);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Runs `batch` sequences that each already hold `context` tokens through `steps` decode
// steps; returns the seconds per step.
Result<double> DecodeSecondsPerStep(Transformer& model, KvCache& cache, int batch, int context,
                                    int steps) {
  const int page_tokens = cache.layout().page_tokens;
  const int pages_per_seq = (context + steps + page_tokens - 1) / page_tokens;
  std::vector<std::vector<PageId>> tables(batch);
  for (int b = 0; b < batch; ++b) {
    for (int p = 0; p < pages_per_seq; ++p) tables[b].push_back(b * pages_per_seq + p);
  }
  // The KV content does not change the work: the cache is left as the prefill run wrote it.
  std::vector<int32_t> token(batch, 1);
  std::vector<float> logits;
  const auto start = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; ++s) {
    std::vector<SequenceChunk> chunks;
    for (int b = 0; b < batch; ++b) {
      chunks.push_back({.tokens = std::span<const int32_t>(&token[b], 1),
                        .start = context + s,
                        .pages = tables[b],
                        .want_logits = true});
    }
    PD_RETURN_IF_ERROR(model.Forward(chunks, cache, &logits));
  }
  return Seconds(start) / steps;
}

// One row of the table: per round, a ceiling measured right before the figure it bounds, so
// that the host's load drifting between the two does not skew the ratio. Medians are printed.
struct Row {
  std::vector<double> tokens_per_s, achieved, ceiling_tps, ratio;
  void Add(double tps, double achieved_rate, double ceiling) {
    tokens_per_s.push_back(tps);
    achieved.push_back(achieved_rate);
    ceiling_tps.push_back(ceiling);
    ratio.push_back(tps / ceiling);
  }
};

int RunBenchEngine(BenchEngineFlags& f) {
  std::vector<int> batches;
  {
    std::stringstream ss(f.batches);
    std::string item;
    while (std::getline(ss, item, ',')) {
      try {
        batches.push_back(std::stoi(item));
      } catch (const std::exception&) {
        return Fail("--batch must be a comma-separated list of positive integers");
      }
      if (batches.back() <= 0) return Fail("--batch sizes must be positive");
    }
  }
  if (batches.empty()) return Fail("--batch is empty");
  PD_ASSIGN_OR_RETURN_CLI(ModelDir dir, LoadFromFlags(f.model));
  Transformer& model = *dir.transformer;
  const ModelConfig& c = dir.config;
  if (f.prompt_len + f.decode_steps > c.MaxContext()) return Fail("--prompt-len beyond context");
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  const int page_tokens = f.model.page_size;
  const int pages_per_seq = (f.prompt_len + f.decode_steps + page_tokens - 1) / page_tokens;
  PD_ASSIGN_OR_RETURN_CLI(
      auto cache, KvCache::Create(model.MakeKvLayout(max_batch * pages_per_seq, page_tokens)));

  // Prefill: one sequence of prompt_len tokens in one step (logits of the last position).
  std::vector<int32_t> prompt(f.prompt_len);
  for (int i = 0; i < f.prompt_len; ++i) prompt[i] = (i * 7919) % c.vocab_size;
  std::vector<PageId> table(pages_per_seq);
  for (int p = 0; p < pages_per_seq; ++p) table[p] = p;
  std::vector<float> logits;
  const SequenceChunk chunk{.tokens = prompt, .start = 0, .pages = table, .want_logits = true};
  auto prefill_seconds = [&]() -> Result<double> {
    const auto start = std::chrono::steady_clock::now();
    PD_RETURN_IF_ERROR(model.Forward(std::span(&chunk, 1), *cache, &logits));
    return Seconds(start);
  };
  if (auto warm = prefill_seconds(); !warm.ok()) return Fail(warm.status().ToString());

  const double macs = LayerMacsPerToken(c);
  const double attn_macs = 2.0 * c.num_layers * c.num_heads * c.head_dim *
                           (static_cast<double>(f.prompt_len) * (f.prompt_len + 1) / 2);
  const double prefill_flops =
      2.0 * (macs * f.prompt_len + attn_macs + static_cast<double>(c.vocab_size) * c.hidden_size);
  const double decode_flops_per_token =
      2.0 * (macs + static_cast<double>(c.vocab_size) * c.hidden_size);
  const double weight_bytes = static_cast<double>(model.WeightBytes());
  const int threads = f.model.threads;
  constexpr double kCeilingSeconds = 0.3;  // best run over this long, per round
  auto gemm_rate = [&] {
    return MeasureBf16GemmFlops(f.prompt_len, 2 * c.intermediate_size, c.hidden_size, threads,
                                kCeilingSeconds);
  };

  // One bandwidth buffer for every round (see MemoryBandwidthProbe).
  PD_ASSIGN_OR_RETURN_CLI(MemoryBandwidthProbe probe,
                          MemoryBandwidthProbe::Create(size_t{1} << 30, threads));
  Row prefill;
  std::vector<double> gemm_rates, bandwidths;
  for (int r = 0; r < f.repeats; ++r) {
    PD_ASSIGN_OR_RETURN_CLI(double gemm, gemm_rate());
    PD_ASSIGN_OR_RETURN_CLI(double t, prefill_seconds());
    gemm_rates.push_back(gemm);
    prefill.Add(f.prompt_len / t, prefill_flops / t / 1e9, gemm / (prefill_flops / f.prompt_len));
  }
  std::vector<Row> decode(batches.size());
  for (size_t i = 0; i < batches.size(); ++i) {
    const int b = batches[i];
    for (int r = 0; r < f.repeats; ++r) {
      PD_ASSIGN_OR_RETURN_CLI(double bandwidth, probe.Measure(kCeilingSeconds));
      PD_ASSIGN_OR_RETURN_CLI(double gemm, gemm_rate());
      PD_ASSIGN_OR_RETURN_CLI(double step,
                              DecodeSecondsPerStep(model, *cache, b, f.prompt_len, f.decode_steps));
      bandwidths.push_back(bandwidth);
      gemm_rates.push_back(gemm);
      // Weights are read once per step whatever the batch; past the bandwidth bound the GEMM
      // rate bounds instead.
      const double ceiling = std::min(b * bandwidth / weight_bytes, gemm / decode_flops_per_token);
      decode[i].Add(b / step, weight_bytes / step / 1e9, ceiling);
    }
  }

  std::printf("model %s: %d layers, hidden %d, %.0f MB of weights read per decode step\n",
              dir.path.c_str(), c.num_layers, c.hidden_size, weight_bytes / 1e6);
  std::printf(
      "ceilings (median of the per-round measurements): oneDNN bf16 GEMM %.1f GFLOP/s "
      "(m=%d n=%d k=%d); memory read %.1f GB/s\n",
      Median(gemm_rates) / 1e9, f.prompt_len, 2 * c.intermediate_size, c.hidden_size,
      Median(bandwidths) / 1e9);
  std::printf("medians of %d rounds, each ratio against the ceiling measured in its round\n\n",
              f.repeats);
  std::printf("| phase | batch | tokens/s | GFLOP/s or GB/s | ceiling tokens/s | ratio |\n");
  std::printf("|---|---|---|---|---|---|\n");
  std::printf("| prefill %d | 1 | %.1f | %.1f GFLOP/s | %.1f | %.0f%% |\n", f.prompt_len,
              Median(prefill.tokens_per_s), Median(prefill.achieved), Median(prefill.ceiling_tps),
              100 * Median(prefill.ratio));
  for (size_t i = 0; i < batches.size(); ++i) {
    std::printf("| decode ctx %d | %d | %.1f | %.1f GB/s | %.1f | %.0f%% |\n", f.prompt_len,
                batches[i], Median(decode[i].tokens_per_s), Median(decode[i].achieved),
                Median(decode[i].ceiling_tps), 100 * Median(decode[i].ratio));
  }
  return 0;
}

}  // namespace

void AddBenchEngineCommand(CLI::App& bench, int* exit_code) {
  auto flags = std::make_shared<BenchEngineFlags>();
  CLI::App* cmd = bench.add_subcommand("engine", "Prefill/decode throughput vs measured ceilings");
  AddModelFlags(cmd, &flags->model);
  cmd->add_option("--batch", flags->batches, "Decode batch sizes, comma-separated")
      ->capture_default_str();
  cmd->add_option("--prompt-len", flags->prompt_len, "Prompt tokens (prefill size, decode context)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--decode-steps", flags->decode_steps, "Decode steps per measurement")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_option("--repeats", flags->repeats,
                  "Rounds per figure, each with its own ceiling (medians reported)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->callback([flags, exit_code] { *exit_code = RunBenchEngine(*flags); });
}

}  // namespace pdserve::cli
