// `pdserve bench engine`: prefill and decode throughput of the forward pass, each beside the
// ceiling measured in the same run (oneDNN bf16 GEMM rate for prefill; memory bandwidth over
// the bytes of weights read per step for decode) and the ratio to it.
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
// steps; returns the median seconds per step over `repeats` runs.
Result<double> DecodeSecondsPerStep(Transformer& model, KvCache& cache, int batch, int context,
                                    int steps, int repeats) {
  const int page_tokens = cache.layout().page_tokens;
  const int pages_per_seq = (context + steps + page_tokens - 1) / page_tokens;
  std::vector<std::vector<PageId>> tables(batch);
  for (int b = 0; b < batch; ++b) {
    for (int p = 0; p < pages_per_seq; ++p) tables[b].push_back(b * pages_per_seq + p);
  }
  // The KV content does not change the work: the cache is left as the prefill run wrote it.
  std::vector<int32_t> token(batch, 1);
  std::vector<float> logits;
  std::vector<double> per_step;
  for (int r = 0; r < repeats; ++r) {
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
    per_step.push_back(Seconds(start) / steps);
  }
  return Median(per_step);
}

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
  std::vector<double> prefill_s;
  for (int r = 0; r < f.repeats + 1; ++r) {
    SequenceChunk chunk{.tokens = prompt, .start = 0, .pages = table, .want_logits = true};
    const auto start = std::chrono::steady_clock::now();
    if (Status s = model.Forward(std::span(&chunk, 1), *cache, &logits); !s.ok()) {
      return Fail(s.ToString());
    }
    if (r > 0) prefill_s.push_back(Seconds(start));  // the first run warms up
  }
  const double t_prefill = Median(prefill_s);
  const double macs = LayerMacsPerToken(c);
  const double attn_macs = 2.0 * c.num_layers * c.num_heads * c.head_dim *
                           (static_cast<double>(f.prompt_len) * (f.prompt_len + 1) / 2);
  const double prefill_flops =
      2.0 * (macs * f.prompt_len + attn_macs + static_cast<double>(c.vocab_size) * c.hidden_size);

  // Ceilings, measured now on the same cores.
  const int threads = f.model.threads;
  auto gemm =
      MeasureBf16GemmFlops(f.prompt_len, 2 * c.intermediate_size, c.hidden_size, threads, 1.0);
  if (!gemm.ok()) return Fail(gemm.status().ToString());
  auto bandwidth = MeasureMemoryBandwidth(size_t{1} << 30, threads, 1.0);
  if (!bandwidth.ok()) return Fail(bandwidth.status().ToString());
  const double weight_bytes = static_cast<double>(model.WeightBytes());

  std::printf("model %s: %d layers, hidden %d, %.0f MB of weights read per decode step\n",
              dir.path.c_str(), c.num_layers, c.hidden_size, weight_bytes / 1e6);
  std::printf("ceilings: oneDNN bf16 GEMM %.1f GFLOP/s (m=%d n=%d k=%d); memory read %.1f GB/s\n\n",
              *gemm / 1e9, f.prompt_len, 2 * c.intermediate_size, c.hidden_size, *bandwidth / 1e9);
  std::printf("| phase | batch | tokens/s | GFLOP/s or GB/s | ceiling tokens/s | ratio |\n");
  std::printf("|---|---|---|---|---|---|\n");
  const double prefill_tps = f.prompt_len / t_prefill;
  const double prefill_ceiling_tps = *gemm / (prefill_flops / f.prompt_len);
  std::printf("| prefill %d | 1 | %.1f | %.1f GFLOP/s | %.1f | %.0f%% |\n", f.prompt_len,
              prefill_tps, prefill_flops / t_prefill / 1e9, prefill_ceiling_tps,
              100 * prefill_tps / prefill_ceiling_tps);
  for (int b : batches) {
    auto step = DecodeSecondsPerStep(model, *cache, b, f.prompt_len, f.decode_steps, f.repeats);
    if (!step.ok()) return Fail(step.status().ToString());
    const double tps = b / *step;
    // Weights are read once per step whatever the batch; past the bandwidth bound the GEMM
    // rate bounds instead.
    const double flops_per_token = 2.0 * (macs + static_cast<double>(c.vocab_size) * c.hidden_size);
    const double ceiling = std::min(b * *bandwidth / weight_bytes, *gemm / flops_per_token);
    std::printf("| decode ctx %d | %d | %.1f | %.1f GB/s | %.1f | %.0f%% |\n", f.prompt_len, b, tps,
                weight_bytes / *step / 1e9, ceiling, 100 * tps / ceiling);
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
  cmd->add_option("--repeats", flags->repeats, "Measurements per figure (median reported)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->callback([flags, exit_code] { *exit_code = RunBenchEngine(*flags); });
}

}  // namespace pdserve::cli
