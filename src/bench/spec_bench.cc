#include "bench/spec_bench.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>

namespace pdserve::bench {
namespace {

struct DecodeRun {
  double decode_seconds = 0;  // every request's first token -> the last token
  int64_t decode_tokens = 0;  // tokens after each request's first
  SpecDecodeStats spec;
};

// B greedy requests of random prompts, run to completion; times the decode part only.
Result<DecodeRun> TimeDecode(Engine& engine, int batch, const SpecBenchOptions& o) {
  using Clock = std::chrono::steady_clock;
  std::mt19937 rng(static_cast<uint32_t>(o.seed));
  const int vocab = engine.model().config().vocab_size;
  int started = 0, finished = 0;
  Clock::time_point decode_start;
  Status failure;
  for (int i = 0; i < batch; ++i) {
    EngineRequest r;
    r.id = "spec-bench-" + std::to_string(i);
    r.prompt.resize(o.prompt_len);
    for (int32_t& t : r.prompt) t = static_cast<int32_t>(rng() % vocab);
    r.params.temperature = 0;
    r.params.ignore_eos = true;
    r.params.max_tokens = o.max_tokens;
    bool first = true;
    r.on_output = [&, first](const RequestOutput& out) mutable {
      if (first && !out.tokens.empty()) {
        first = false;
        if (++started == batch) decode_start = Clock::now();
      }
      if (out.finished) {
        ++finished;
        if (!out.status.ok()) failure = out.status;
      }
    };
    PD_RETURN_IF_ERROR(engine.Submit(std::move(r)));
  }
  engine.RunUntilIdle();
  const auto end = Clock::now();
  PD_RETURN_IF_ERROR(failure);
  if (finished != batch) return Status::Internal("not every benchmark request finished");
  DecodeRun run;
  run.decode_seconds = std::chrono::duration<double>(end - decode_start).count();
  run.decode_tokens = static_cast<int64_t>(batch) * (o.max_tokens - 1);
  run.spec = engine.stats().spec;
  return run;
}

}  // namespace

Status RunSpecBench(const SpecBenchOptions& o,
                    const std::function<Result<std::unique_ptr<Engine>>(bool)>& make_engine) {
  if (o.max_tokens < 2) return Status::InvalidArgument("--max-tokens must be at least 2");
  const int k = o.num_speculative_tokens;
  std::printf(
      "# greedy decode, prompt %d, %d tokens a request, K = %d. alpha: accepted / drafted; "
      "E = (1 - alpha^(K+1)) / (1 - alpha) tokens a step if acceptances were independent; "
      "expected speed-up = E x plain step / (draft + verify step)\n",
      o.prompt_len, o.max_tokens, k);
  std::printf("%5s %7s %8s %10s %10s %8s %9s %9s %9s %6s %8s\n", "batch", "alpha", "mean_len",
              "plain_t/s", "spec_t/s", "speedup", "plain_ms", "draft_ms", "verify_ms", "E",
              "expected");
  for (int batch : o.batches) {
    PD_ASSIGN_OR_RETURN(auto plain_engine, make_engine(false));
    PD_ASSIGN_OR_RETURN(DecodeRun plain, TimeDecode(*plain_engine, batch, o));
    plain_engine.reset();
    PD_ASSIGN_OR_RETURN(auto spec_engine, make_engine(true));
    PD_ASSIGN_OR_RETURN(DecodeRun spec, TimeDecode(*spec_engine, batch, o));
    spec_engine.reset();
    const SpecDecodeStats& s = spec.spec;
    if (s.drafts == 0) return Status::Internal("the speculative run drafted nothing");
    const double alpha = static_cast<double>(s.accepted_tokens) / s.draft_tokens;
    const double mean_len = 1.0 + static_cast<double>(s.accepted_tokens) / s.drafts;
    // Each request decodes in lock-step (same prompt length and max_tokens): steps per request.
    const double plain_step = plain.decode_seconds / (o.max_tokens - 1);
    const double spec_steps = static_cast<double>(s.drafts) / batch;
    const double draft_step = s.draft_seconds / spec_steps;
    const double verify_step = spec.decode_seconds / spec_steps - draft_step;
    const double e = alpha >= 1.0 ? k + 1.0 : (1.0 - std::pow(alpha, k + 1)) / (1.0 - alpha);
    const double plain_tps = plain.decode_tokens / plain.decode_seconds;
    const double spec_tps = spec.decode_tokens / spec.decode_seconds;
    std::printf("%5d %7.3f %8.2f %10.1f %10.1f %8.2f %9.3f %9.3f %9.3f %6.2f %8.2f\n", batch, alpha,
                mean_len, plain_tps, spec_tps, spec_tps / plain_tps, plain_step * 1e3,
                draft_step * 1e3, verify_step * 1e3, e,
                e * plain_step / (draft_step + verify_step));
    std::fflush(stdout);
  }
  return Status::Ok();
}

}  // namespace pdserve::bench
