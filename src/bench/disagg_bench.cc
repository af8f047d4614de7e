#include "bench/disagg_bench.h"

#include <algorithm>
#include <map>
#include <memory>
#include <random>

#include <fmt/format.h>

#include "common/dtype.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "fabric/config.h"
#include "kernels/dispatch.h"
#include "kv/shard_layout.h"
#include "kv/transfer_plan.h"
#include "messenger/decode_messenger.h"
#include "messenger/prefill_messenger.h"
#include "model/fingerprint.h"

namespace pdserve::bench {
namespace {

using messenger::DecodeMessenger;
using messenger::Event;
using messenger::EventKind;
using messenger::PrefillMessenger;

// The bench's two nodes. Destroyed in reverse order: messengers after their engine's loop
// stopped and before the engine (the prefill messenger is the engine's step observer).
struct Nodes {
  std::unique_ptr<Engine> prefill_engine;
  std::unique_ptr<Engine> decode_engine;
  std::unique_ptr<PrefillMessenger> prefill;
  std::unique_ptr<DecodeMessenger> decode;
  int num_layers = 0;
  int vocab = 0;
  int max_context = 0;
  KvValuesPerToken kv;
  ~Nodes() {
    if (decode_engine) decode_engine->Stop();
    if (prefill_engine) prefill_engine->Stop();
    decode.reset();
    prefill.reset();
  }
};

Result<std::unique_ptr<Engine>> LoadEngine(const DisaggBenchOptions& o, int threads,
                                           ModelIdentity* identity, ModelConfig* config) {
  ModelDirOptions load = o.load;
  load.transformer.threads = threads;
  load.load_tokenizer = false;  // token ids only
  PD_ASSIGN_OR_RETURN(ModelDir dir, LoadModelDir(o.model_dir, load));
  // The formats as loaded, as `pdserve serve` names them, so both handshakes read alike.
  const std::string weights =
      WeightsIdentity(dir.transformer->matrix_dtype(), dir.transformer->linear_dtype());
  PD_ASSIGN_OR_RETURN(*identity, IdentifyModel(dir.path, dir.config, weights));
  *config = dir.config;
  // Every repeat sends the same prompt, which P must compute whole each time.
  EngineOptions engine = o.engine;
  engine.prefix_caching = false;
  return Engine::Create(std::move(dir.transformer), nullptr, engine);
}

Result<std::unique_ptr<Nodes>> StartNodes(const DisaggBenchOptions& o) {
  auto nodes = std::make_unique<Nodes>();
  ModelIdentity identity;
  ModelConfig config;
  PD_ASSIGN_OR_RETURN(nodes->prefill_engine,
                      LoadEngine(o, o.load.transformer.threads, &identity, &config));
  // D only runs the prompt's last token: one thread leaves the cores to P.
  PD_ASSIGN_OR_RETURN(nodes->decode_engine, LoadEngine(o, 1, &identity, &config));
  nodes->num_layers = nodes->prefill_engine->kv_layout().num_layers;
  nodes->vocab = config.vocab_size;
  nodes->max_context = config.MaxContext();
  nodes->kv = KvValuesOf(config);

  messenger::MessengerOptions m;
  PD_ASSIGN_OR_RETURN(m.fabric.provider, fabric::ParseProvider(o.provider));
  if (m.fabric.provider == fabric::Provider::kTcp) m.fabric.node = "127.0.0.1";
  m.fabric.pin_progress_threads = false;  // as `pdserve serve` does
  m.cluster_key = "pdserve-bench-disagg";
  m.model_fingerprint = identity.Serialize();
  m.kernel_path = kernels::ArithmeticIdentity();
  m.prefill_timeout = std::chrono::seconds(o.timeout_s);
  // Long prefills on a loaded machine must not look like a dead peer.
  m.peer_timeout = std::chrono::seconds(30);
  m.handshake_timeout = std::chrono::seconds(30);
  PD_ASSIGN_OR_RETURN(nodes->prefill, PrefillMessenger::Create(nodes->prefill_engine.get(), m));
  const fabric::TransferEngineAddress address = nodes->prefill->address();
  std::vector<messenger::PrefillPeerSpec> peers = {
      {.name = "prefill",
       .resolve = [address] { return Result<fabric::TransferEngineAddress>(address); }}};
  PD_ASSIGN_OR_RETURN(nodes->decode,
                      DecodeMessenger::Create(nodes->decode_engine.get(), m, std::move(peers)));
  nodes->prefill_engine->Start();
  nodes->decode_engine->Start();
  if (!nodes->decode->WaitForPeers(1, Deadline::After(std::chrono::seconds(30)))) {
    return Status::DeadlineExceeded("the decode node did not finish the handshake in 30 s");
  }
  return nodes;
}

// Waits for D's final output of the request.
class Waiter {
 public:
  void Done(const RequestOutput& out) {
    MutexLock lock(&mu_);
    out_ = out;
    done_ = true;
    cv_.NotifyAll();
  }
  Result<RequestOutput> Wait(Deadline deadline) {
    MutexLock lock(&mu_);
    while (!done_) {
      if (cv_.WaitUntil(&mu_, deadline.at()) == std::cv_status::timeout) break;
    }
    if (!done_) return Status::DeadlineExceeded("the request did not finish in time");
    return out_;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  bool done_ GUARDED_BY(mu_) = false;
  RequestOutput out_ GUARDED_BY(mu_);
};

double SecondsBetween(TimePoint from, TimePoint to) {
  return std::chrono::duration<double>(to - from).count();
}

// The figures of the request that started at `start`, from both event logs: every event of
// either log after `start` is this request's (one request at a time).
Result<DisaggRun> ReadRun(const std::vector<Event>& p_events, const std::vector<Event>& d_events,
                          TimePoint start, int num_layers) {
  DisaggRun run;
  uint64_t request = 0;
  TimePoint sent{}, landed{};
  for (const Event& e : d_events) {
    if (e.at < start) continue;
    if (e.kind == EventKind::kPrefillSent) request = e.request, sent = e.at;
    if (e.kind == EventKind::kKvLanded && e.request == request) landed = e.at;
  }
  if (request == 0 || landed == TimePoint{}) {
    return Status::Internal("the decode node's event log lacks the transfer");
  }
  std::map<uint64_t, TimePoint> scheduled;
  std::map<uint64_t, TimePoint> last_layer_done;
  TimePoint first_post = TimePoint::max();
  for (const Event& e : p_events) {
    if (e.at < start) continue;
    if (e.kind == EventKind::kStepScheduled) scheduled[e.step] = e.at;
    if (e.kind == EventKind::kLayerDone && e.layer == num_layers - 1) {
      last_layer_done[e.step] = e.at;
    }
    if (e.kind == EventKind::kWritesPosted && e.request == request) {
      first_post = std::min(first_post, e.at);
    }
  }
  if (scheduled.empty() || !last_layer_done.count(scheduled.rbegin()->first) ||
      first_post == TimePoint::max()) {
    return Status::Internal("the prefill node's event log lacks the request's steps");
  }
  const TimePoint compute_end = last_layer_done.at(scheduled.rbegin()->first);
  run.steps = static_cast<int>(scheduled.size());
  run.compute_s = SecondsBetween(scheduled.begin()->second, compute_end);
  run.tail_s = SecondsBetween(compute_end, landed);
  run.transfer_s = SecondsBetween(first_post, landed);
  run.latency_s = SecondsBetween(sent, landed);
  return run;
}

Result<DisaggRun> RunOnce(Nodes& nodes, const std::vector<int32_t>& prompt, bool streaming,
                          int index, Deadline deadline) {
  nodes.prefill->SetKvStreaming(streaming);
  const messenger::PrefillMessengerStats p0 = nodes.prefill->stats();
  const messenger::DecodeMessengerStats d0 = nodes.decode->stats();
  auto waiter = std::make_shared<Waiter>();
  EngineRequest request;
  request.id = fmt::format("bench-disagg-{}", index);
  request.prompt = prompt;
  request.params.temperature = 0;
  request.params.max_tokens = 1;
  request.params.ignore_eos = true;
  request.on_output = [waiter](const RequestOutput& out) {
    if (out.finished) waiter->Done(out);
  };
  const TimePoint start = Clock::now();
  PD_RETURN_IF_ERROR(nodes.decode->Submit(std::move(request)));
  PD_ASSIGN_OR_RETURN(RequestOutput out, waiter->Wait(deadline));
  if (out.finish_reason != FinishReason::kLength) {
    return Status::Internal(fmt::format("the request ended with {}: {}",
                                        FinishReasonName(out.finish_reason),
                                        out.status.ToString()));
  }
  // P lets the request go once every write completed, D once the engine finished it (after it
  // published the landing): then both sides' counters are final.
  while (nodes.prefill->stats().requests_in_flight > 0 ||
         nodes.decode->stats().requests_in_flight > 0) {
    if (deadline.Passed()) return Status::DeadlineExceeded("the prefill node did not settle");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  PD_ASSIGN_OR_RETURN(DisaggRun run,
                      ReadRun(nodes.prefill->events().Snapshot(), nodes.decode->events().Snapshot(),
                              start, nodes.num_layers));
  const messenger::PrefillMessengerStats p1 = nodes.prefill->stats();
  const messenger::DecodeMessengerStats d1 = nodes.decode->stats();
  run.streaming = streaming;
  run.writes_sent = p1.writes_sent - p0.writes_sent;
  run.bytes_sent = p1.bytes_sent - p0.bytes_sent;
  run.writes_received = d1.writes_received - d0.writes_received;
  run.bytes_received = d1.bytes_received - d0.bytes_received;
  return run;
}

struct Spread {
  double median = 0, min = 0, max = 0;
};

Spread SpreadOf(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  const double median = n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  return {median, v.front(), v.back()};
}

}  // namespace

KvValuesPerToken KvValuesOf(const ModelConfig& config) {
  if (config.is_mla()) {
    const MlaConfig& a = config.mla;
    return {.cached = a.latent_dim(),
            .plain = config.num_heads * (a.q_head_dim() + a.v_head_dim),
            .latent = true};
  }
  const int kv = 2 * config.num_kv_heads * config.head_dim;
  return {.cached = kv, .plain = kv, .latent = false};
}

Result<DisaggBenchResult> RunDisaggBench(const DisaggBenchOptions& o) {
  if (o.prompt_len < 2) {
    return Status::InvalidArgument("--prompt-len must be at least 2 (the last token is D's)");
  }
  if (o.repeats < 1) return Status::InvalidArgument("--repeats must be at least 1");
  if (o.provider != "shm" && o.provider != "tcp") {
    return Status::InvalidArgument("--fabric-provider must be shm or tcp, got '" + o.provider +
                                   "'");
  }
  PD_ASSIGN_OR_RETURN(std::unique_ptr<Nodes> nodes, StartNodes(o));
  if (o.prompt_len >= nodes->max_context) {
    return Status::InvalidArgument(fmt::format("--prompt-len {} exceeds the model's context {}",
                                               o.prompt_len, nodes->max_context));
  }
  const KvLayout& layout = nodes->prefill_engine->kv_layout();
  DisaggBenchResult result;
  result.prompt_len = o.prompt_len;
  result.num_layers = layout.num_layers;
  result.pages = layout.PagesForTokens(o.prompt_len - 1);
  if (result.pages > layout.num_pages) {
    return Status::InvalidArgument(
        fmt::format("the prompt needs {} KV pages, the cache holds {}: raise --kv-cache-mb",
                    result.pages, layout.num_pages));
  }
  PD_ASSIGN_OR_RETURN(KvShardLayout shards,
                      KvShardLayout::ForTensorParallel(layout.num_kv_heads, /*tp_size=*/1));
  const KvSideLayout side{shards, {layout}};
  PD_ASSIGN_OR_RETURN(TransferPlan plan, TransferPlan::Create(side, side));
  // TP 1: the replica seed changes nothing.
  result.plan_writes = plan.ExpectedWrites(static_cast<size_t>(result.pages), 0);
  result.plan_bytes = plan.ExpectedBytes(static_cast<size_t>(result.pages), 0);
  result.page_tokens = layout.page_tokens;
  result.kv = nodes->kv;
  // The same whole pages of a plain cache: the bytes scale with the values a token holds.
  result.plain_kv_bytes = static_cast<uint64_t>(result.pages) * layout.page_tokens *
                          static_cast<uint64_t>(result.kv.plain) * DTypeSize(layout.dtype) *
                          static_cast<uint64_t>(layout.num_layers);

  std::mt19937 rng(o.seed);
  std::uniform_int_distribution<int32_t> token(0, nodes->vocab - 1);
  std::vector<int32_t> prompt(static_cast<size_t>(o.prompt_len));
  for (int32_t& t : prompt) t = token(rng);
  // Warm-up (not reported): first-touch of pages and buffers, both code paths.
  const std::vector<int32_t> warm(prompt.begin(), prompt.begin() + std::min(o.prompt_len, 64));
  int index = 0;
  for (bool streaming : {true, false}) {
    PD_RETURN_IF_ERROR(RunOnce(*nodes, warm, streaming, index++,
                               Deadline::After(std::chrono::seconds(o.timeout_s)))
                           .status());
  }
  for (int r = 0; r < o.repeats; ++r) {
    // On and off alternate, so a change in the machine's load falls on both.
    for (bool streaming : {true, false}) {
      PD_ASSIGN_OR_RETURN(DisaggRun run,
                          RunOnce(*nodes, prompt, streaming, index++,
                                  Deadline::After(std::chrono::seconds(o.timeout_s))));
      PD_LOG_INFO("run {} streaming {}: compute {:.1f} ms, tail {:.2f} ms", r,
                  streaming ? "on" : "off", run.compute_s * 1e3, run.tail_s * 1e3);
      result.runs.push_back(run);
    }
  }
  return result;
}

std::string FormatDisaggTable(const DisaggBenchResult& result) {
  auto column = [&](bool streaming, auto field) {
    std::vector<double> v;
    for (const DisaggRun& r : result.runs) {
      if (r.streaming == streaming) v.push_back(field(r));
    }
    return SpreadOf(std::move(v));
  };
  auto cell = [](const Spread& s, const char* format) {
    return fmt::format("{} [{}, {}]", fmt::format(fmt::runtime(format), s.median),
                       fmt::format(fmt::runtime(format), s.min),
                       fmt::format(fmt::runtime(format), s.max));
  };
  // KV bytes a token costs to move: what the plan writes over the tokens P prefills (whole pages,
  // so a partly filled last page counts in full).
  std::string out = fmt::format(
      "prompt {} tokens: P prefills {} ({} pages x {} layers); plan: {} writes, {} bytes, {:.0f} "
      "bytes per prefilled token\n\n",
      result.prompt_len, result.prompt_len - 1, result.pages, result.num_layers, result.plan_writes,
      result.plan_bytes,
      static_cast<double>(result.plan_bytes) / std::max(1, result.prompt_len - 1));
  // Against a plain K/V cache of the same model, over the same whole pages.
  const KvValuesPerToken& kv = result.kv;
  if (result.plan_bytes > 0 && kv.cached > 0) {
    out += fmt::format(
        "KV per token and layer: {} values ({}); a plain K/V cache: {} values ({}), {} bytes for "
        "these pages, {:.0f} per prefilled token: {:.2f}x the plan's\n\n",
        kv.cached, kv.latent ? "the MLA latent" : "K and V", kv.plain,
        kv.latent ? "the heads' decompressed K and V" : "the same", result.plain_kv_bytes,
        static_cast<double>(result.plain_kv_bytes) / std::max(1, result.prompt_len - 1),
        static_cast<double>(result.plain_kv_bytes) / static_cast<double>(result.plan_bytes));
  }
  out += "| median [min, max] | streaming on | streaming off |\n| --- | --- | --- |\n";
  struct Row {
    const char* name;
    const char* format;
    double (*field)(const DisaggRun&);
  };
  const Row rows[] = {
      {"prefill compute (ms)", "{:.1f}", [](const DisaggRun& r) { return r.compute_s * 1e3; }},
      {"transfer tail (ms)", "{:.2f}", [](const DisaggRun& r) { return r.tail_s * 1e3; }},
      {"tail / compute (%)", "{:.3f}",
       [](const DisaggRun& r) { return 100 * r.tail_s / r.compute_s; }},
      {"first write posted -> landed (ms)", "{:.2f}",
       [](const DisaggRun& r) { return r.transfer_s * 1e3; }},
      {"bandwidth, first post -> landed (GB/s)", "{:.3f}",
       [](const DisaggRun& r) { return static_cast<double>(r.bytes_sent) / r.transfer_s / 1e9; }},
      {"PrefillRequest -> KV landed (ms)", "{:.1f}",
       [](const DisaggRun& r) { return r.latency_s * 1e3; }},
      {"forward passes", "{:.0f}", [](const DisaggRun& r) { return double(r.steps); }},
      {"writes sent (P) / received (D)", "{:.0f}",
       [](const DisaggRun& r) { return double(r.writes_sent); }},
      {"bytes sent (P)", "{:.0f}", [](const DisaggRun& r) { return double(r.bytes_sent); }},
      {"bytes received (D)", "{:.0f}", [](const DisaggRun& r) { return double(r.bytes_received); }},
  };
  for (const Row& row : rows) {
    out += fmt::format("| {} | {} | {} |\n", row.name, cell(column(true, row.field), row.format),
                       cell(column(false, row.field), row.format));
  }
  const Spread on = column(true, [](const DisaggRun& r) { return r.compute_s; });
  const Spread off = column(false, [](const DisaggRun& r) { return r.compute_s; });
  if (off.median > 0) {
    out += fmt::format("\nforward pass with streaming on / off (medians): {:.3f}\n",
                       on.median / off.median);
  }
  return out;
}

}  // namespace pdserve::bench
