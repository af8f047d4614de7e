// How `pdserve bench engine` measures (see engine_bench.h).
//
// Like is compared with like. A ceiling is the best run of its probe within a window
// (kWindowSeconds); the figure beside it is the best run of the engine within a window of the
// same length, taken right after it (at least decode_steps runs of one decode step on
// identical work, or at least 3 prefills). On a shared host both sides are disturbed by
// neighbours, and the best run of each is what the machine can do. The median run is printed
// too, for what a user sees typically. Each figure is measured in `repeats` rounds, every time
// right after its own ceiling, and the medians over the rounds are printed.
#include "bench/engine_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/ceilings.h"
#include "kernels/dispatch.h"
#include "kv/kv_cache.h"
#include "model/transformer.h"

namespace pdserve::bench {
namespace {

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

// A window's runs: the best (shortest) and the median, in seconds.
struct RunTimes {
  double best, median;
};

constexpr double kWindowSeconds = 0.3;

// Runs `once` (after one untimed warm-up) until kWindowSeconds have passed and at least
// `min_runs` runs were timed.
template <typename Fn>
Result<RunTimes> TimeRuns(int min_runs, Fn&& once) {
  PD_RETURN_IF_ERROR(once());
  std::vector<double> runs;
  const auto start = std::chrono::steady_clock::now();
  while (static_cast<int>(runs.size()) < min_runs || Seconds(start) < kWindowSeconds) {
    const auto t0 = std::chrono::steady_clock::now();
    PD_RETURN_IF_ERROR(once());
    runs.push_back(Seconds(t0));
  }
  return RunTimes{.best = *std::min_element(runs.begin(), runs.end()), .median = Median(runs)};
}

// Times one decode step of `batch` sequences that each already hold `context` tokens. Every
// run repeats the same step (the token at position `context`, whose K/V it rewrites), so all
// runs do identical work. The KV content does not change the work (no path depends on it):
// sequence 0's pages hold what the prefill wrote, the others zeros.
Result<RunTimes> DecodeStepTimes(Transformer& model, KvCache& cache, int batch, int context,
                                 int min_steps) {
  const int page_tokens = cache.layout().page_tokens;
  const int pages_per_seq = (context + 1 + page_tokens - 1) / page_tokens;
  std::vector<std::vector<PageId>> tables(batch);
  for (int b = 0; b < batch; ++b) {
    for (int p = 0; p < pages_per_seq; ++p) tables[b].push_back(b * pages_per_seq + p);
  }
  std::vector<int32_t> token(batch, 1);
  std::vector<SequenceChunk> chunks;
  for (int b = 0; b < batch; ++b) {
    chunks.push_back({.tokens = std::span<const int32_t>(&token[b], 1),
                      .start = context,
                      .pages = tables[b],
                      .want_logits = true});
  }
  std::vector<float> logits;
  return TimeRuns(min_steps, [&] { return model.Forward(chunks, cache, &logits); });
}

// One row of the table: per round, a ceiling measured right before the figure it bounds, so
// that the host's load drifting between the two does not skew the ratio. Medians are printed.
// `tokens` are processed per run; `work` units (FLOP or bytes) are done per run.
struct Row {
  std::vector<double> best_tps, median_tps, achieved, ceiling_tps, ratio;
  void Add(RunTimes t, int tokens, double work, double ceiling) {
    best_tps.push_back(tokens / t.best);
    median_tps.push_back(tokens / t.median);
    achieved.push_back(work / t.best / 1e9);
    ceiling_tps.push_back(ceiling);
    ratio.push_back(tokens / t.best / ceiling);
  }
};

}  // namespace

Status RunEngineBench(ModelDir& dir, const EngineBenchOptions& f) {
  const std::vector<int>& batches = f.batches;
  if (batches.empty()) return Status::InvalidArgument("no decode batch sizes");
  for (int b : batches) {
    if (b <= 0) return Status::InvalidArgument("decode batch sizes must be positive");
  }
  if (f.prompt_len < 1 || f.decode_steps < 1 || f.repeats < 1 || f.page_tokens < 1) {
    return Status::InvalidArgument(
        "prompt length, decode steps, repeats and page size must be >= 1");
  }
  Transformer& model = *dir.transformer;
  const ModelConfig& c = dir.config;
  if (f.prompt_len + 1 > c.MaxContext()) {
    return Status::InvalidArgument("prompt length beyond the model's context");
  }
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  const int page_tokens = f.page_tokens;
  const int pages_per_seq = (f.prompt_len + 1 + page_tokens - 1) / page_tokens;
  PD_ASSIGN_OR_RETURN(auto cache,
                      KvCache::Create(model.MakeKvLayout(max_batch * pages_per_seq, page_tokens)));

  // Prefill: one sequence of prompt_len tokens in one step (logits of the last position).
  std::vector<int32_t> prompt(f.prompt_len);
  for (int i = 0; i < f.prompt_len; ++i) prompt[i] = (i * 7919) % c.vocab_size;
  std::vector<PageId> table(pages_per_seq);
  for (int p = 0; p < pages_per_seq; ++p) table[p] = p;
  std::vector<float> logits;
  const SequenceChunk chunk{.tokens = prompt, .start = 0, .pages = table, .want_logits = true};
  auto prefill_once = [&] { return model.Forward(std::span(&chunk, 1), *cache, &logits); };

  const double macs = LayerMacsPerToken(c);
  const double attn_macs = 2.0 * c.num_layers * c.num_heads * c.head_dim *
                           (static_cast<double>(f.prompt_len) * (f.prompt_len + 1) / 2);
  const double prefill_flops =
      2.0 * (macs * f.prompt_len + attn_macs + static_cast<double>(c.vocab_size) * c.hidden_size);
  const double decode_flops_per_token =
      2.0 * (macs + static_cast<double>(c.vocab_size) * c.hidden_size);
  const double weight_bytes = static_cast<double>(model.WeightBytes());
  // K and V of every layer for the context and the new token, read by one decode step (a
  // page's block holds K and V of page_tokens tokens for one layer).
  const KvLayout& kv = cache->layout();
  const double kv_bytes_per_seq =
      static_cast<double>(f.prompt_len + 1) * kv.num_layers * kv.block_bytes() / kv.page_tokens;
  const int threads = f.threads;
  // The compute ceiling is oneDNN's bf16 matmul where this CPU has one; oneDNN runs bf16 only
  // with AVX-512 (or AVX2-VNNI-2), so elsewhere it is its f32 matmul, which is also what our
  // AVX2 path does per multiply-add (bf16 widened to f32, FMA).
  DType gemm_type = DType::kBF16;
  if (MeasureGemmFlops(gemm_type, 8, 8, 8, threads, 0.0).status().code() ==
      StatusCode::kUnavailable) {
    gemm_type = DType::kF32;
  }
  auto gemm_rate = [&] {
    return MeasureGemmFlops(gemm_type, f.prompt_len, 2 * c.intermediate_size, c.hidden_size,
                            threads, kWindowSeconds);
  };

  // One bandwidth buffer for every round (see MemoryBandwidthProbe).
  PD_ASSIGN_OR_RETURN(MemoryBandwidthProbe probe,
                      MemoryBandwidthProbe::Create(size_t{1} << 30, threads));
  Row prefill;
  std::vector<double> gemm_rates, bandwidths;
  for (int r = 0; r < f.repeats; ++r) {
    PD_ASSIGN_OR_RETURN(double gemm, gemm_rate());
    PD_ASSIGN_OR_RETURN(RunTimes t, TimeRuns(3, prefill_once));
    gemm_rates.push_back(gemm);
    prefill.Add(t, f.prompt_len, prefill_flops, gemm / (prefill_flops / f.prompt_len));
  }
  std::vector<Row> decode(batches.size());
  for (size_t i = 0; i < batches.size(); ++i) {
    const int b = batches[i];
    for (int r = 0; r < f.repeats; ++r) {
      PD_ASSIGN_OR_RETURN(double gemm, gemm_rate());
      PD_ASSIGN_OR_RETURN(double bandwidth, probe.Measure(kWindowSeconds));
      PD_ASSIGN_OR_RETURN(RunTimes t,
                          DecodeStepTimes(model, *cache, b, f.prompt_len, f.decode_steps));
      bandwidths.push_back(bandwidth);
      gemm_rates.push_back(gemm);
      // A step reads every weight once whatever the batch, and each sequence's K/V; past the
      // bandwidth bound the GEMM rate bounds instead.
      const double step_bytes = weight_bytes + b * kv_bytes_per_seq;
      const double ceiling = std::min(b * bandwidth / step_bytes, gemm / decode_flops_per_token);
      decode[i].Add(t, b, step_bytes, ceiling);
    }
  }

  std::printf(
      "kernels: %s\n"
      "model %s: %d layers, hidden %d; a decode step reads %.0f MB of weights and %.1f MB of "
      "K/V per sequence\n",
      kernels::DescribeSelection().c_str(), dir.path.c_str(), c.num_layers, c.hidden_size,
      weight_bytes / 1e6, kv_bytes_per_seq / 1e6);
  std::printf(
      "ceilings (median of the per-round measurements): oneDNN %s GEMM %.1f GFLOP/s "
      "(m=%d n=%d k=%d); memory read %.1f GB/s\n",
      std::string(DTypeFlagName(gemm_type)).c_str(), Median(gemm_rates) / 1e9, f.prompt_len,
      2 * c.intermediate_size, c.hidden_size, Median(bandwidths) / 1e9);
  std::printf(
      "medians of %d rounds; in each round the best run of a %.1f s window, against the best run "
      "of its ceiling in a window as long, measured just before\n\n",
      f.repeats, kWindowSeconds);
  std::printf(
      "| phase | kernels | batch | tokens/s (best run) | tokens/s (median run) | GFLOP/s or GB/s | "
      "ceiling tokens/s | ratio |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  const std::string path(kernels::ActivePath());
  auto print_row = [&path](const std::string& phase, int batch, const Row& row, const char* unit) {
    std::printf("| %s | %s | %d | %.1f | %.1f | %.1f %s | %.1f | %.0f%% |\n", phase.c_str(),
                path.c_str(), batch, Median(row.best_tps), Median(row.median_tps),
                Median(row.achieved), unit, Median(row.ceiling_tps), 100 * Median(row.ratio));
  };
  print_row("prefill " + std::to_string(f.prompt_len), 1, prefill, "GFLOP/s");
  for (size_t i = 0; i < batches.size(); ++i) {
    print_row("decode ctx " + std::to_string(f.prompt_len), batches[i], decode[i], "GB/s");
  }
  return Status::Ok();
}

}  // namespace pdserve::bench
