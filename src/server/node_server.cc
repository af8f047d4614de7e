#include "server/node_server.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <random>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "chat/chat_prompt.h"
#include "common/clock.h"
#include "common/logging.h"
#include "http/api_error.h"
#include "http/registration_body.h"
#include "http/server_setup.h"
#include "http/sse.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/prefill_peer_header.h"
#include "server/request_drain.h"
#include "tokenizer/bounded_encode.h"

namespace pdserve::server {
namespace {

using http::ApiError;
using http::ApiResult;
using http::SendError;
using json = nlohmann::json;

std::string RandomHex(int digits) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string out;
  while (static_cast<int>(out.size()) < digits) out += fmt::format("{:016x}", rng());
  out.resize(digits);
  return out;
}

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

ApiError Loading() { return ApiError::Unavailable("the model is still loading", "loading"); }

}  // namespace

struct NodeServer::Impl {
  explicit Impl(NodeServerOptions o) : options(std::move(o)) {}

  // A validated request, tokenized, ready to submit.
  struct Prepared {
    std::string prefill_peer;  // HOST:PORT from X-Prefill-Peer or llm-d's headers (decode role)
    GenerationRequest request;
    std::vector<int32_t> prompt;
    ResponseContext ctx;
  };

  ParseLimits Limits() const {
    ParseLimits limits;
    limits.vocab_size = model.tokenizer ? model.tokenizer->vocab_size() : 0;
    return limits;
  }

  std::string ModelName() const { return options.served_model_name; }

  DrainContext Drains() {
    return DrainContext{model.engine.get(), &metrics, &live, &stopping,
                        std::chrono::seconds(options.request_timeout_s)};
  }

  ApiResult<Prepared> Prepare(ApiKind kind, const std::string& body);
  Status Submit(const Prepared& p, RequestDrain& drain);
  std::optional<ApiError> CheckOverload() const;
  // Waits until no request is live or `deadline`; true if none is.
  bool WaitNoneLive(Deadline deadline) const;

  void HandleGenerate(ApiKind kind, const httplib::Request& req, httplib::Response& res);
  void RespondWhole(Prepared p, httplib::Response& res);
  void RespondStream(Prepared p, httplib::Response& res);
  void HandleModels(httplib::Response& res);
  // GET /v1/models/{id}: the one model this node serves, or 404 model_not_found.
  void HandleModel(const std::string& id, httplib::Response& res);
  json ModelEntry() const;
  // /health (readiness false) or /ready: loading, draining and stopping are 503 on both; a
  // degraded node is 200 on /health and 503 on /ready, both saying why.
  void HandleHealth(httplib::Response& res, bool readiness);
  void HandleMetrics(httplib::Response& res);
  void HandleTokenize(const httplib::Request& req, httplib::Response& res);
  void HandleJoin(const httplib::Request& req, httplib::Response& res);
  void HandleDetokenize(const httplib::Request& req, httplib::Response& res);

  NodeServerOptions options;
  http::ServerConfig http_config;
  ServerMetrics metrics;
  std::atomic<bool> ready{false};
  std::atomic<bool> draining{false};  // Drain began: new requests refused, running ones go on
  std::atomic<bool> stopping{false};
  ServedModel model;  // written once before ready is set
  std::unique_ptr<chat::ChatPromptRenderer> chat;
  LiveRequests live;
};

ApiResult<NodeServer::Impl::Prepared> NodeServer::Impl::Prepare(ApiKind kind,
                                                                const std::string& body) {
  const ParseLimits limits = Limits();
  ApiResult<GenerationRequest> parsed = kind == ApiKind::kChat
                                            ? ParseChatRequest(body, limits)
                                            : ParseCompletionRequest(body, limits);
  if (!parsed.ok()) return parsed.error();
  Prepared p;
  p.request = std::move(parsed.value());
  GenerationRequest& r = p.request;
  if (!r.model.empty() && r.model != ModelName()) return ApiError::ModelNotFound(r.model);
  // Prompts that cannot fit are refused after encoding about max_model_len tokens of them, not
  // all of them (see tokenizer/bounded_encode.h).
  const size_t max_prompt = static_cast<size_t>(std::max(0, model.max_model_len - 1));
  const char* param = kind == ApiKind::kChat ? "messages" : "prompt";
  std::optional<std::vector<int32_t>> encoded;
  if (kind == ApiKind::kChat) {
    Result<chat::ChatPrompt> rendered =
        chat->Render(r.messages, r.tools, r.chat_template_kwargs, r.add_generation_prompt);
    if (!rendered.ok()) return ApiError::InvalidRequest(rendered.status().message(), "messages");
    encoded = EncodeWithin(*model.tokenizer, rendered->text, rendered->add_special, max_prompt);
  } else if (r.prompt_is_ids) {
    encoded = r.prompt_ids;
  } else {
    encoded = EncodeWithin(*model.tokenizer, r.prompt_text, /*add_special=*/true, max_prompt);
  }
  if (!encoded) {
    return ApiError::ContextLengthExceeded(
        fmt::format("the prompt has more than {} tokens; this model's context is {} tokens",
                    max_prompt, model.max_model_len),
        param);
  }
  p.prompt = std::move(*encoded);
  const int prompt_len = static_cast<int>(p.prompt.size());
  if (prompt_len == 0) return ApiError::InvalidRequest("the prompt is empty", "prompt");
  if (prompt_len >= model.max_model_len) {
    return ApiError::ContextLengthExceeded(
        fmt::format("the prompt has {} tokens; this model's context is {} tokens", prompt_len,
                    model.max_model_len),
        param);
  }
  // Without max_tokens: completions default to 16 (OpenAI), chat to the rest of the context.
  if (!r.max_tokens_set) {
    r.params.max_tokens = kind == ApiKind::kChat ? model.max_model_len - prompt_len : 16;
  }
  p.ctx.kind = kind;
  p.ctx.id = (kind == ApiKind::kChat ? "chatcmpl-" : "cmpl-") + RandomHex(24);
  p.ctx.created = UnixSeconds();
  p.ctx.model = ModelName();
  p.ctx.tokenizer = model.tokenizer.get();
  p.ctx.logprobs = r.logprobs;
  p.ctx.return_token_ids = r.return_token_ids;
  p.ctx.prompt_ids = p.prompt;
  return p;
}

std::optional<ApiError> NodeServer::Impl::CheckOverload() const {
  if (draining.load() || stopping.load()) {
    return ApiError::Unavailable("the server is stopping", "shutting_down");
  }
  if (live.waiting() >= options.max_waiting) {
    return ApiError::Overloaded(
        fmt::format("more than {} requests are waiting; retry later", options.max_waiting));
  }
  return std::nullopt;
}

Status NodeServer::Impl::Submit(const Prepared& p, RequestDrain& drain) {
  EngineRequest request;
  request.prompt = p.prompt;
  request.params = p.request.params;
  if (model.role) {
    return drain.Submit(std::move(request), [this, &p](EngineRequest r) {
      return model.role->Submit(*model.engine, std::move(r), p.prefill_peer);
    });
  }
  return drain.Submit(std::move(request));
}

void NodeServer::Impl::HandleGenerate(ApiKind kind, const httplib::Request& req,
                                      httplib::Response& res) {
  if (!ready.load(std::memory_order_acquire)) return SendError(res, Loading());
  if (model.role && !model.role->serves_generation()) {
    return SendError(res,
                     ApiError::NotFound(req.method, req.path + " (this is a prefill node; "
                                                               "send requests to a decode node)"));
  }
  if (auto e = CheckOverload()) return SendError(res, *e);
  ApiResult<Prepared> prepared = Prepare(kind, req.body);
  if (!prepared.ok()) return SendError(res, prepared.error());
  // A decode node's prefill node for this request: X-Prefill-Peer, or llm-d's scheduler's
  // headers. Colocated nodes prefill everything themselves and ignore them.
  if (model.role && model.role->role() == NodeRole::kDecode) {
    ApiResult<std::string> peer = PrefillPeerFromHeaders(
        {.prefill_peer = req.get_header_value(kPrefillPeerHeader),
         .prefiller_host_port = req.get_header_value(kPrefillerHostPortHeader),
         .prefiller_url = req.get_header_value(kPrefillerUrlHeader)});
    if (!peer.ok()) return SendError(res, peer.error());
    prepared.value().prefill_peer = std::move(peer.value());
  }
  if (prepared.value().request.stream) {
    RespondStream(std::move(prepared.value()), res);
  } else {
    RespondWhole(std::move(prepared.value()), res);
  }
}

void NodeServer::Impl::RespondWhole(Prepared p, httplib::Response& res) {
  RequestDrain drain(Drains(), p.ctx.id);
  if (Status s = Submit(p, drain); !s.ok()) return SendError(res, ApiError::FromStatus(s));
  GenerationResult result;
  RequestOutput last;
  std::vector<RequestOutput> batch;
  while (!drain.finished()) {
    switch (drain.Next(&batch)) {
      case RequestDrain::Step::kNothingYet:
        continue;
      case RequestDrain::Step::kTimedOut:
        return SendError(res, IdleTimeoutError());
      case RequestDrain::Step::kOutputs:
        for (RequestOutput& out : batch) {
          result.text += out.text;
          result.token_ids.insert(result.token_ids.end(), out.tokens.begin(), out.tokens.end());
          result.samples.insert(result.samples.end(), out.samples.begin(), out.samples.end());
          if (out.finished) last = std::move(out);
        }
        break;
    }
  }
  if (auto e = FinishError(last)) return SendError(res, *e);
  result.finish_reason = FinishReasonName(last.finish_reason);
  result.prompt_tokens = static_cast<int>(p.prompt.size());
  result.completion_tokens = static_cast<int>(result.token_ids.size());
  res.set_content(FormatResponse(p.ctx, result), "application/json");
}

namespace {

// The SSE events one engine output becomes (none, one or several), appended to *events.
// Completions: every output with text or tokens is a chunk, the last carries finish_reason.
// Chat: text (or token ids when asked for) makes a delta; the finish gets its own empty-delta
// chunk. With include_usage, the usage chunk follows the finish.
void AppendEvents(const ResponseContext& ctx, const GenerationRequest& request, int prompt_tokens,
                  int completion_tokens, const RequestOutput& out, size_t* text_offset,
                  std::string* events) {
  const bool is_chat = ctx.kind == ApiKind::kChat;
  const bool has_content = !out.text.empty() || (!out.tokens.empty() && !is_chat) ||
                           (!out.tokens.empty() && ctx.return_token_ids);
  if (has_content || (out.finished && !is_chat)) {
    ChunkContent c;
    c.text = out.text;
    c.token_ids = out.tokens;
    c.samples = out.samples;
    c.usage_null = request.include_usage;
    if (out.finished && !is_chat) c.finish_reason = FinishReasonName(out.finish_reason);
    *events += http::SseEvent(FormatChunk(ctx, c, text_offset));
  }
  if (out.finished && is_chat) {
    ChunkContent c;
    c.finish_reason = FinishReasonName(out.finish_reason);
    c.usage_null = request.include_usage;
    *events += http::SseEvent(FormatChunk(ctx, c, text_offset));
  }
  if (out.finished && request.include_usage) {
    *events += http::SseEvent(FormatUsageChunk(ctx, prompt_tokens, completion_tokens));
  }
}

// How long a stream may stay silent before a comment probes whether its client is still there.
constexpr auto kSseProbeInterval = std::chrono::milliseconds(100);

}  // namespace

void NodeServer::Impl::RespondStream(Prepared p, httplib::Response& res) {
  // Everything the chunked provider needs lives here; httplib keeps the provider (and so this
  // state) until the response is written or the client is gone, then destroys it — and the
  // drain's destructor cancels the engine request if it had not finished.
  struct StreamState {
    Prepared p;
    std::unique_ptr<RequestDrain> drain;
    bool opened = false;
    bool done = false;
    TimePoint last_write = Clock::now();
    size_t text_offset = 0;
    int completion_tokens = 0;
    std::vector<RequestOutput> batch;
  };
  auto st = std::make_shared<StreamState>();
  st->p = std::move(p);
  st->drain = std::make_unique<RequestDrain>(Drains(), st->p.ctx.id);
  if (Status s = Submit(st->p, *st->drain); !s.ok()) {
    return SendError(res, ApiError::FromStatus(s));
  }
  auto provider = [st](size_t /*offset*/, httplib::DataSink& sink) -> bool {
    if (st->done) return true;
    if (!st->opened) {
      st->opened = true;
      if (st->p.ctx.kind == ApiKind::kChat) {
        // The role chunk goes out at once; httplib calls the provider again right after.
        ChunkContent role;
        role.role_chunk = true;
        role.usage_null = st->p.request.include_usage;
        const std::string event = http::SseEvent(FormatChunk(st->p.ctx, role, &st->text_offset));
        return sink.write(event.data(), event.size());
      }
    }
    std::string events;
    switch (st->drain->Next(&st->batch)) {
      case RequestDrain::Step::kNothingYet:
        break;
      case RequestDrain::Step::kTimedOut:
        events += http::SseError(IdleTimeoutError());
        st->done = true;
        break;
      case RequestDrain::Step::kOutputs:
        for (const RequestOutput& out : st->batch) {
          st->completion_tokens += static_cast<int>(out.tokens.size());
          if (out.finished) st->done = true;
          if (auto e = FinishError(out)) {
            events += http::SseError(*e);
            break;
          }
          AppendEvents(st->p.ctx, st->p.request, static_cast<int>(st->p.prompt.size()),
                       st->completion_tokens, out, &st->text_offset, &events);
        }
        break;
    }
    if (st->done) events += http::kSseDone;
    // httplib notices a gone client only when a write fails, so a stream that has nothing to
    // say (a long prompt still being prefilled) sends an SSE comment now and then: without it
    // a client that left would keep its request (and a prefill node's work) alive until the
    // first token. Clients ignore comments.
    const TimePoint now = Clock::now();
    if (events.empty() && now - st->last_write >= kSseProbeInterval) events = ":\n\n";
    if (!events.empty()) st->last_write = now;
    // A false write means the client is gone; returning false ends the response.
    if (!events.empty() && !sink.write(events.data(), events.size())) return false;
    if (st->done) sink.done();
    return true;
  };
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(http::kSseContentType, std::move(provider));
}

json NodeServer::Impl::ModelEntry() const {
  json entry = {{"id", ModelName()},
                {"object", "model"},
                {"created", UnixSeconds()},
                {"owned_by", "pdserve"}};
  if (ready.load()) entry["max_model_len"] = model.max_model_len;
  return entry;
}

void NodeServer::Impl::HandleModels(httplib::Response& res) {
  json j = {{"object", "list"}, {"data", json::array({ModelEntry()})}};
  res.set_content(DumpJson(j), "application/json");
}

void NodeServer::Impl::HandleModel(const std::string& id, httplib::Response& res) {
  if (id != ModelName()) {
    http::SendError(res, http::ApiError::ModelNotFound(id));
    return;
  }
  res.set_content(DumpJson(ModelEntry()), "application/json");
}

void NodeServer::Impl::HandleHealth(httplib::Response& res, bool readiness) {
  if (!ready.load() || draining.load() || stopping.load()) {
    res.status = 503;
    res.set_content(stopping.load()   ? "stopping\n"
                    : draining.load() ? "draining\n"
                                      : "loading\n",
                    "text/plain");
    return;
  }
  const std::string degraded = model.role ? model.role->Degraded() : "";
  if (degraded.empty()) return res.set_content("ok\n", "text/plain");
  // Alive and answering (/health 200), but not what its role promises: a load balancer that
  // reads /ready sends its traffic elsewhere.
  if (readiness) res.status = 503;
  res.set_content("degraded: " + degraded + "\n", "text/plain");
}

void NodeServer::Impl::HandleMetrics(httplib::Response& res) {
  const EngineStats stats = ready.load() ? model.engine->stats() : EngineStats{};
  MetricsText text;
  text.Append(metrics.Render(stats));
  if (ready.load() && model.role) model.role->AppendMetrics(text);
  if (options.extra_metrics) options.extra_metrics(text);
  res.set_content(text.text(), "text/plain; version=0.0.4");
}

void NodeServer::Impl::HandleJoin(const httplib::Request& req, httplib::Response& res) {
  if (!ready.load()) return SendError(res, Loading());
  if (!model.role || model.role->role() != NodeRole::kDecode) {
    return SendError(res, ApiError::NotFound("POST", req.path));
  }
  // The cluster proof was checked before routing (http/server_setup.h).
  http::ApiResult<http::NodeAddress> node = http::ParseRegistrationBody(req.body);
  if (!node.ok()) return SendError(res, node.error());
  if (Status s = model.role->Join(node.value()); !s.ok()) {
    return SendError(res, ApiError::InvalidRequest(s.message(), "url", "invalid_registration"));
  }
  res.set_content(json{{"joined", true}}.dump(), "application/json");
}

void NodeServer::Impl::HandleTokenize(const httplib::Request& req, httplib::Response& res) {
  if (!ready.load()) return SendError(res, Loading());
  ApiResult<TokenizeRequest> parsed = ParseTokenizeRequest(req.body, Limits());
  if (!parsed.ok()) return SendError(res, parsed.error());
  TokenizeRequest& r = parsed.value();
  if (!r.model.empty() && r.model != ModelName()) {
    return SendError(res, ApiError::ModelNotFound(r.model));
  }
  std::vector<int32_t> ids;
  if (r.is_chat) {
    Result<chat::ChatPrompt> rendered =
        chat->Render(r.messages, r.tools, r.chat_template_kwargs, r.add_generation_prompt);
    if (!rendered.ok()) {
      return SendError(res, ApiError::InvalidRequest(rendered.status().message(), "messages"));
    }
    ids = model.tokenizer->Encode(rendered->text,
                                  r.add_special_tokens.value_or(rendered->add_special));
  } else {
    ids = model.tokenizer->Encode(r.prompt, r.add_special_tokens.value_or(true));
  }
  json j = {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", model.max_model_len}};
  res.set_content(DumpJson(j), "application/json");
}

void NodeServer::Impl::HandleDetokenize(const httplib::Request& req, httplib::Response& res) {
  if (!ready.load()) return SendError(res, Loading());
  ApiResult<std::vector<int32_t>> ids = ParseDetokenizeRequest(req.body, Limits());
  if (!ids.ok()) return SendError(res, ids.error());
  json j = {{"prompt", model.tokenizer->Decode(ids.value(), /*skip_special=*/false)}};
  res.set_content(DumpJson(j), "application/json");
}

NodeServer::NodeServer(NodeServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))), http_(std::make_unique<http::Server>()) {
  Impl* impl = impl_.get();
  impl->http_config.threads = std::max(4, impl->options.http_threads);
  impl->http_config.max_body_bytes = impl->options.max_body_bytes;
  impl->http_config.api_key = impl->options.api_key;
  impl->http_config.cluster_key = impl->options.cluster_key;
  impl->http_config.max_connections = impl->options.max_connections;
  impl->http_config.header_timeout = std::chrono::seconds(impl->options.header_timeout_s);
  http::ConfigureServer(*http_, impl->http_config);
  std::vector<http::PostRoute> posts;
  posts.push_back({"/v1/completions", [impl](const httplib::Request& req, httplib::Response& res) {
                     impl->HandleGenerate(ApiKind::kCompletion, req, res);
                   }});
  posts.push_back(
      {"/v1/chat/completions", [impl](const httplib::Request& req, httplib::Response& res) {
         impl->HandleGenerate(ApiKind::kChat, req, res);
       }});
  posts.push_back(
      {"/internal/messenger/join", [impl](const httplib::Request& req, httplib::Response& res) {
         impl->HandleJoin(req, res);
       }});
  posts.push_back({"/tokenize", [impl](const httplib::Request& req, httplib::Response& res) {
                     impl->HandleTokenize(req, res);
                   }});
  posts.push_back({"/detokenize", [impl](const httplib::Request& req, httplib::Response& res) {
                     impl->HandleDetokenize(req, res);
                   }});
  http::AddPostRoutes(*http_, std::move(posts));
  http_->Get("/v1/models",
             [impl](const httplib::Request&, httplib::Response& res) { impl->HandleModels(res); });
  // Model ids may contain '/' (e.g. "Qwen/Qwen2.5-0.5B-Instruct").
  http_->Get("/v1/models/(.+)", [impl](const httplib::Request& req, httplib::Response& res) {
    impl->HandleModel(req.matches[1].str(), res);
  });
  http_->Get("/health", [impl](const httplib::Request&, httplib::Response& res) {
    impl->HandleHealth(res, /*readiness=*/false);
  });
  http_->Get("/ready", [impl](const httplib::Request&, httplib::Response& res) {
    impl->HandleHealth(res, /*readiness=*/true);
  });
  http_->Get("/metrics",
             [impl](const httplib::Request&, httplib::Response& res) { impl->HandleMetrics(res); });
  http_->Get(R"(/internal/messenger/([a-z_]+))",
             [impl](const httplib::Request& req, httplib::Response& res) {
               if (!impl->ready.load()) return SendError(res, Loading());
               Result<std::string> body =
                   impl->model.role ? impl->model.role->InternalRoute(req.matches[1].str())
                                    : Result<std::string>(Status::NotFound("no role routes"));
               if (!body.ok()) return SendError(res, ApiError::NotFound("GET", req.path));
               res.set_content(*body, "text/plain");
             });
  http_->set_logger([impl](const httplib::Request& req, const httplib::Response& res) {
    if (res.status >= 400) impl->metrics.RequestFailed(res.status);
    // Health checks and scrapes come every second from routers and monitors: debug, so that
    // the info log shows requests (PDSERVE_LOG_LEVEL=debug shows them too).
    const bool poll = req.path == "/health" || req.path == "/ready" || req.path == "/metrics";
    const auto level = poll ? spdlog::level::debug : spdlog::level::info;
    PD_LOG_AT(level, "request_id={} method={} path={} status={} remote={} bytes_in={}",
              http::RequestIdOf(res), req.method, req.path, res.status, req.remote_addr,
              req.body.size());
  });
}

NodeServer::~NodeServer() { Stop(); }

Status NodeServer::Bind() {
  const NodeServerOptions& o = impl_->options;
  PD_ASSIGN_OR_RETURN(bound_port_, http::BindServer(*http_, o.host, o.port, impl_->http_config));
  return Status::Ok();
}

void NodeServer::Start() {
  listen_thread_ = std::thread([this] { http_->listen_after_bind(); });
}

Status NodeServer::SetModel(ServedModel model) {
  if (!model.tokenizer || !model.engine) {
    return Status::InvalidArgument("a served model needs a tokenizer and an engine");
  }
  const Tokenizer& tokenizer = *model.tokenizer;
  impl_->chat = chat::ChatPromptRenderer::Create(tokenizer.chat_template(), tokenizer.bos_token(),
                                                 tokenizer.eos_token());
  impl_->model = std::move(model);
  impl_->model.engine->Start();
  impl_->ready.store(true, std::memory_order_release);
  return Status::Ok();
}

bool NodeServer::Impl::WaitNoneLive(Deadline deadline) const {
  while (!live.Ids().empty()) {
    if (deadline.Passed()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

void NodeServer::Drain(Duration grace) {
  if (stopped_.load() || impl_->draining.exchange(true)) return;
  PD_LOG_INFO("draining: new requests get 503; {} running may finish within {:.1f} s",
              impl_->live.Ids().size(), std::chrono::duration<double>(grace).count());
  if (impl_->WaitNoneLive(Deadline::After(grace))) return;
  // A live request's drain goes away only after its handler wrote its last byte, so once none
  // is live every cancelled request has told its client.
  const std::vector<std::string> left = impl_->live.Ids();
  PD_LOG_WARN("grace period over: cancelling {} request(s)", left.size());
  if (impl_->ready.load()) {
    for (const std::string& id : left) impl_->model.engine->Cancel(id);
  }
  if (!impl_->WaitNoneLive(Deadline::AfterMs(5000))) {
    PD_LOG_WARN("{} request(s) still writing after cancel; stopping anyway",
                impl_->live.Ids().size());
  }
}

void NodeServer::Stop() {
  if (stopped_.exchange(true)) return;
  impl_->stopping.store(true);
  if (impl_->ready.load()) {
    for (const std::string& id : impl_->live.Ids()) impl_->model.engine->Cancel(id);
  }
  http_->stop();
  if (listen_thread_.joinable()) listen_thread_.join();
  if (impl_->model.engine) impl_->model.engine->Stop();
}

}  // namespace pdserve::server
