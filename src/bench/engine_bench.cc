// How `pdserve bench engine` measures (see engine_bench.h).
//
// Like is compared with like. A ceiling is the best run of its probe within a window; the
// figure beside it is the best run of the engine within a window as long and as close to it as
// it can be: a prefill's window (kWindowSeconds, at least 3 prefills) right after the GEMM
// ceiling's, and a decode step's runs (at least decode_steps of one decode step on identical
// work) interleaved with the bandwidth probe's passes in one window of 2 x kWindowSeconds
// (the GEMM ceiling of a decode row is measured just before it). On a shared host both sides
// are disturbed by neighbours, and the best run of each is what the machine can do. The median
// run is printed too, for what a user sees typically. Each figure is measured in `repeats`
// rounds, every time with its own ceilings, and the medians over the rounds are printed.
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

// Multiply-adds per token of every matrix in the layers (attention scores excluded); an MoE
// layer's: its router and the experts a token chooses.
double LayerMacsPerToken(const ModelConfig& c) {
  const double hd = c.head_dim;
  const double qkv = (c.num_heads + 2.0 * c.num_kv_heads) * hd * c.hidden_size;
  const double o = c.num_heads * hd * c.hidden_size;
  const double mlp = 3.0 * c.intermediate_size * c.hidden_size;
  const double moe =
      (c.moe.num_experts + 3.0 * c.moe.experts_per_token * c.moe.expert_intermediate) *
      c.hidden_size;
  double macs = 0;
  for (int layer = 0; layer < c.num_layers; ++layer) {
    macs += qkv + o + (c.IsMoeLayer(layer) ? moe : mlp);
  }
  return macs;
}

// The middle value of `v` (the upper one of an even count). Precondition: `v` is not empty.
double UpperMedian(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A window's runs: the best (shortest) and the median, in seconds.
struct RunTimes {
  double best, median;
};

constexpr double kWindowSeconds = 0.3;

// Runs `once` until `window` seconds have passed and at least `min_runs` runs were timed, each
// run after a call of `between` (untimed: the ceiling's probe, where it shares the window).
// One untimed run of each comes first, as a warm-up.
template <typename Fn, typename Between>
Result<RunTimes> TimeRuns(int min_runs, double window, Fn&& once, Between&& between) {
  PD_RETURN_IF_ERROR(once());
  between();
  std::vector<double> runs;
  const auto start = std::chrono::steady_clock::now();
  while (static_cast<int>(runs.size()) < min_runs || Seconds(start) < window) {
    between();
    const auto t0 = std::chrono::steady_clock::now();
    PD_RETURN_IF_ERROR(once());
    runs.push_back(Seconds(t0));
  }
  return RunTimes{.best = *std::min_element(runs.begin(), runs.end()), .median = UpperMedian(runs)};
}

// Times one decode step of `batch` sequences that each already hold `context` tokens, in turn
// with passes of the bandwidth probe, so that the step and its ceiling see the same neighbours
// (on a shared host the read rate moves between consecutive windows: docs/benchmarks.md,
// "Method"). After one untimed step and one untimed pass, steps and passes alternate until
// 2 x kWindowSeconds have passed and at least `min_steps` steps were timed; *bandwidth receives
// the best pass. Every run repeats the same step (the token at position `context`, whose K/V it
// rewrites), so all runs do identical work. The KV content does not change a dense model's work
// (no path depends on it): sequence 0's pages hold what the prefill wrote, the others zeros.
// Each sequence's token differs, so an MoE model's rows choose different experts, as a real
// batch's do; `trace` receives what they chose (one untimed step, before the others).
Result<RunTimes> DecodeStepTimes(Transformer& model, KvCache& cache, int batch, int context,
                                 int min_steps, MemoryBandwidthProbe& probe, double* bandwidth,
                                 RoutingTrace* trace) {
  const int page_tokens = cache.layout().page_tokens;
  const int pages_per_seq = (context + 1 + page_tokens - 1) / page_tokens;
  std::vector<std::vector<PageId>> tables(batch);
  for (int b = 0; b < batch; ++b) {
    for (int p = 0; p < pages_per_seq; ++p) tables[b].push_back(b * pages_per_seq + p);
  }
  std::vector<int32_t> token(batch);
  for (int b = 0; b < batch; ++b)
    token[b] = static_cast<int32_t>((1 + b * 7919) % model.config().vocab_size);
  std::vector<SequenceChunk> chunks;
  for (int b = 0; b < batch; ++b) {
    chunks.push_back({.tokens = std::span<const int32_t>(&token[b], 1),
                      .start = context,
                      .pages = tables[b],
                      .want_logits = true});
  }
  std::vector<float> logits;
  model.set_routing_trace(trace);
  Status traced = model.Forward(chunks, cache, &logits);
  model.set_routing_trace(nullptr);
  PD_RETURN_IF_ERROR(traced);
  *bandwidth = 0.0;
  bool warm = false;  // TimeRuns' first pass is the warm-up: not counted
  return TimeRuns(
      min_steps, 2 * kWindowSeconds, [&] { return model.Forward(chunks, cache, &logits); },
      [&] {
        const double rate = probe.Pass();
        if (warm) *bandwidth = std::max(*bandwidth, rate);
        warm = true;
      });
}

// One row of the table: per round, a ceiling measured beside the figure it bounds (just before
// it, or in the same window), so that the host's load drifting between the two does not skew
// the ratio. Medians are printed.
// `tokens` are processed per run; `work` units (FLOP or bytes) are done per run.
// Decode rows also keep the ratio to the bandwidth ceiling alone (`by_bandwidth`, tokens/s),
// whichever ceiling binds: the figure a decode node's memory-bound goal is stated in.
struct Row {
  std::vector<double> best_tps, median_tps, achieved, ceiling_tps, ratio, bandwidth_ratio;
  void Add(RunTimes t, int tokens, double work, double ceiling, double by_bandwidth = 0) {
    best_tps.push_back(tokens / t.best);
    median_tps.push_back(tokens / t.median);
    achieved.push_back(work / t.best / 1e9);
    ceiling_tps.push_back(ceiling);
    ratio.push_back(tokens / t.best / ceiling);
    if (by_bandwidth > 0) bandwidth_ratio.push_back(tokens / t.best / by_bandwidth);
  }
};

// The decode contexts to run: the caller's, each checked, or the defaults that fit the model.
// `skipped` receives the defaults left out.
Result<std::vector<int>> DecodeContexts(const EngineBenchOptions& f, int max_context,
                                        std::vector<int>* skipped) {
  if (f.contexts.empty()) {
    std::vector<int> contexts;
    for (int ctx : kDefaultDecodeContexts) {
      (ctx + 1 <= max_context ? contexts : *skipped).push_back(ctx);
    }
    // A model shorter than every default still gets one decode row, at its longest context.
    if (contexts.empty()) contexts.push_back(max_context - 1);
    return contexts;
  }
  for (int ctx : f.contexts) {
    if (ctx < 1) return Status::InvalidArgument("decode contexts must be positive");
    if (ctx + 1 > max_context) {
      return Status::InvalidArgument("decode context " + std::to_string(ctx) +
                                     " beyond the model's context of " +
                                     std::to_string(max_context));
    }
  }
  return f.contexts;
}

// Distinct experts a pass's rows chose per MoE layer, averaged over its MoE layers (0: none).
double MeanExpertsHit(const RoutingTrace& trace) {
  if (trace.layers.empty()) return 0;
  double total = 0;
  for (const RoutingTrace::Layer& l : trace.layers) {
    std::vector<int32_t> experts = l.experts;
    std::sort(experts.begin(), experts.end());
    total += static_cast<double>(std::unique(experts.begin(), experts.end()) - experts.begin());
  }
  return total / static_cast<double>(trace.layers.size());
}

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
  std::vector<int> skipped;
  PD_ASSIGN_OR_RETURN(const std::vector<int> contexts, DecodeContexts(f, c.MaxContext(), &skipped));
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  const int max_context = *std::max_element(contexts.begin(), contexts.end());
  const int page_tokens = f.page_tokens;
  auto pages_for = [page_tokens](int tokens) { return (tokens + page_tokens - 1) / page_tokens; };
  const int prefill_pages = pages_for(f.prompt_len + 1);
  PD_ASSIGN_OR_RETURN(
      auto cache,
      KvCache::Create(model.MakeKvLayout(
          std::max(prefill_pages, max_batch * pages_for(max_context + 1)), page_tokens)));

  // Prefill: one sequence of prompt_len tokens in one step (logits of the last position).
  std::vector<int32_t> prompt(f.prompt_len);
  for (int i = 0; i < f.prompt_len; ++i) prompt[i] = (i * 7919) % c.vocab_size;
  std::vector<PageId> table(prefill_pages);
  for (int p = 0; p < prefill_pages; ++p) table[p] = p;
  std::vector<float> logits;
  const SequenceChunk chunk{.tokens = prompt, .start = 0, .pages = table, .want_logits = true};
  auto prefill_once = [&] { return model.Forward(std::span(&chunk, 1), *cache, &logits); };

  const double macs = LayerMacsPerToken(c);
  // Attention's multiply-adds for one query at `ctx` positions: scores and weighted sum.
  auto attention_macs = [&c](double ctx) {
    return 2.0 * c.num_layers * c.num_heads * c.head_dim * ctx;
  };
  const double prefill_flops =
      2.0 * (macs * f.prompt_len + attention_macs(f.prompt_len * (f.prompt_len + 1.0) / 2) +
             static_cast<double>(c.vocab_size) * c.hidden_size);
  auto decode_flops_per_token = [&](int ctx) {
    return 2.0 *
           (macs + attention_macs(ctx + 1.0) + static_cast<double>(c.vocab_size) * c.hidden_size);
  };
  const double weight_bytes = static_cast<double>(model.WeightBytes());
  // K and V of every layer for the context and the new token, read by one decode step (a
  // page's block holds K and V of page_tokens tokens for one layer).
  const KvLayout& kv = cache->layout();
  auto kv_bytes_per_seq = [&kv](int ctx) {
    return static_cast<double>(ctx + 1) * kv.num_layers * kv.block_bytes() / kv.page_tokens;
  };
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
    PD_ASSIGN_OR_RETURN(RunTimes t, TimeRuns(3, kWindowSeconds, prefill_once, [] {}));
    gemm_rates.push_back(gemm);
    prefill.Add(t, f.prompt_len, prefill_flops, gemm / (prefill_flops / f.prompt_len));
  }
  struct DecodeRow {
    int context, batch;
    Row row;
    int bandwidth_bound = 0;  // rounds whose ceiling was the bandwidth's (else the GEMM's)
    double weight_bytes = 0;  // weights the step reads (of an MoE model: the experts hit)
    double experts_hit = 0;   // distinct experts per MoE layer, mean over the layers
  };
  std::vector<DecodeRow> decode;
  for (int ctx : contexts) {
    for (int b : batches) {
      DecodeRow& d = decode.emplace_back(DecodeRow{.context = ctx, .batch = b, .row = {}});
      for (int r = 0; r < f.repeats; ++r) {
        PD_ASSIGN_OR_RETURN(double gemm, gemm_rate());
        double bandwidth = 0.0;
        RoutingTrace trace;
        PD_ASSIGN_OR_RETURN(RunTimes t, DecodeStepTimes(model, *cache, b, ctx, f.decode_steps,
                                                        probe, &bandwidth, &trace));
        bandwidths.push_back(bandwidth);
        gemm_rates.push_back(gemm);
        // A step reads every weight once whatever the batch (of an MoE layer, each expert its
        // rows chose, once), and each sequence's K/V; past the bandwidth bound the GEMM rate
        // bounds instead.
        d.weight_bytes = static_cast<double>(model.StepWeightBytes(trace));
        d.experts_hit = MeanExpertsHit(trace);
        const double step_bytes = d.weight_bytes + b * kv_bytes_per_seq(ctx);
        const double by_bandwidth = b * bandwidth / step_bytes;
        const double by_gemm = gemm / decode_flops_per_token(ctx);
        d.bandwidth_bound += by_bandwidth <= by_gemm ? 1 : 0;
        d.row.Add(t, b, step_bytes, std::min(by_bandwidth, by_gemm), by_bandwidth);
      }
    }
  }

  std::printf(
      "kernels: %s\n"
      "model %s: %d layers, hidden %d; %.0f MB of weights, each read once a decode step (of an "
      "MoE layer, the experts chosen), and %.1f MB of K/V per sequence per 1000 tokens of "
      "context\n",
      kernels::DescribeSelection().c_str(), dir.path.c_str(), c.num_layers, c.hidden_size,
      weight_bytes / 1e6, kv_bytes_per_seq(999) / 1e6);
  // The format of the linear layers (`--weights`) sets the bytes a step reads, hence the
  // decode ceilings.
  const std::string weights_format(DTypeFlagName(model.linear_dtype()));
  std::printf(
      "weights: linear layers in %s, %.0f bytes of weights a dense decode step reads; lm_head in "
      "%s, %zu bytes of them\n",
      weights_format.c_str(), weight_bytes, std::string(DTypeFlagName(model.head_dtype())).c_str(),
      model.HeadWeightBytes());
  for (int ctx : skipped) {
    std::printf("decode context %d skipped: beyond the model's context of %d\n", ctx,
                c.MaxContext());
  }
  std::printf(
      "ceilings (median of the per-round measurements): oneDNN %s GEMM %.1f GFLOP/s "
      "(m=%d n=%d k=%d); memory read %.1f GB/s\n",
      std::string(DTypeFlagName(gemm_type)).c_str(), UpperMedian(gemm_rates) / 1e9, f.prompt_len,
      2 * c.intermediate_size, c.hidden_size, UpperMedian(bandwidths) / 1e9);
  std::printf(
      "medians of %d rounds; in each round the best run of a %.1f s window, against the best run "
      "of its ceiling in a window as long (a prefill: measured just before; a decode step: its "
      "runs alternate with the bandwidth probe's passes in one window); a decode ceiling is read "
      "bandwidth over weights + K/V bytes per step, or the GEMM rate where that is lower; "
      "\"of bandwidth\" is a decode row's ratio to the bandwidth ceiling alone\n\n",
      f.repeats, kWindowSeconds);
  std::printf(
      "| phase | kernels | weights | batch | tokens/s (best run) | tokens/s (median run) | GFLOP/s "
      "or GB/s | ceiling tokens/s | ratio | bound | of bandwidth |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  const std::string path(kernels::ActivePath());
  auto print_row = [&path, &weights_format](const std::string& phase, int batch, const Row& row,
                                            const char* unit, const char* bound) {
    char of_bandwidth[16] = "-";
    if (!row.bandwidth_ratio.empty()) {
      std::snprintf(of_bandwidth, sizeof(of_bandwidth), "%.0f%%",
                    100 * UpperMedian(row.bandwidth_ratio));
    }
    std::printf("| %s | %s | %s | %d | %.1f | %.1f | %.1f %s | %.1f | %.0f%% | %s | %s |\n",
                phase.c_str(), path.c_str(), weights_format.c_str(), batch,
                UpperMedian(row.best_tps), UpperMedian(row.median_tps), UpperMedian(row.achieved),
                unit, UpperMedian(row.ceiling_tps), 100 * UpperMedian(row.ratio), bound,
                of_bandwidth);
  };
  print_row("prefill " + std::to_string(f.prompt_len), 1, prefill, "GFLOP/s", "GEMM");
  for (const DecodeRow& d : decode) {
    print_row("decode ctx " + std::to_string(d.context), d.batch, d.row, "GB/s",
              2 * d.bandwidth_bound > f.repeats ? "bandwidth" : "GEMM");
  }
  if (c.moe.num_experts > 0) {
    std::printf(
        "\nexperts: %d per MoE layer, %d chosen per token; a decode step reads each expert its "
        "rows chose once\n\n| phase | batch | distinct experts hit per MoE layer | weights read "
        "per step (MB) | of all weights |\n|---|---|---|---|---|\n",
        c.moe.num_experts, c.moe.experts_per_token);
    for (const DecodeRow& d : decode) {
      std::printf("| decode ctx %d | %d | %.1f | %.0f | %.0f%% |\n", d.context, d.batch,
                  d.experts_hit, d.weight_bytes / 1e6, 100 * d.weight_bytes / weight_bytes);
    }
  }
  return Status::Ok();
}

}  // namespace pdserve::bench
