#include "server/node_server.h"

#include <dirent.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/logging.h"
#include "http/api_error.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/output_channel.h"

namespace pdserve::server {
namespace {

using json = nlohmann::json;
// Handlers wake at least this often to notice shutdown and idle deadlines.
constexpr auto kPollSlice = std::chrono::milliseconds(200);
constexpr char kRequestIdHeader[] = "X-Request-Id";

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

// A request id from a client or router is echoed only if it is short and printable.
bool IsUsableRequestId(const std::string& id) {
  if (id.empty() || id.size() > 128) return false;
  return std::all_of(id.begin(), id.end(), [](char c) { return c > 0x20 && c < 0x7f; });
}

void SendError(httplib::Response& res, const ApiError& e) {
  res.status = e.http_status;
  if (e.http_status == 429 || e.http_status == 503) res.set_header("Retry-After", "1");
  res.set_content(e.ToJson(), "application/json");
}

ApiError ErrorForHttpStatus(int status) {
  switch (status) {
    case 404:
      return ApiError{404, "invalid_request_error", "not_found", "no such route", ""};
    case 405:
      return ApiError{405, "invalid_request_error", "method_not_allowed", "method not allowed", ""};
    case 413:
      return ApiError{413, "invalid_request_error", "payload_too_large", "request body too large",
                      ""};
    case 414:
      return ApiError{414, "invalid_request_error", "uri_too_long", "request URI too long", ""};
    default:
      if (status >= 500) return ApiError{status, "internal_error", "internal_error", "error", ""};
      return ApiError{status, "invalid_request_error", "bad_request", "bad request", ""};
  }
}

// cpp-httplib (Debian's 0.11 build) listens with a backlog of 5, so a burst of clients (64
// streams opened at once, a router's retries) overflows the accept queue and some see their
// connection reset. Linux lets listen() on a listening socket change its backlog; httplib does
// not expose its socket, so find it: the listening TCP socket bound to `port`.
void RaiseListenBacklog(int port, int backlog) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return;
  while (dirent* e = readdir(dir)) {
    const int fd = std::atoi(e->d_name);
    if (fd <= 2 || fd == dirfd(dir)) continue;
    int listening = 0;
    socklen_t len = sizeof(listening);
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) continue;
    sockaddr_storage addr{};
    socklen_t alen = sizeof(addr);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0) continue;
    int bound = -1;
    if (addr.ss_family == AF_INET) bound = ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    if (addr.ss_family == AF_INET6) {
      bound = ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
    }
    if (bound == port && ::listen(fd, backlog) == 0) {
      PD_LOG_DEBUG("listen backlog of port {} raised to {}", port, backlog);
    }
  }
  closedir(dir);
}

}  // namespace

struct NodeServer::Impl {
  explicit Impl(NodeServerOptions o) : options(std::move(o)) {}

  // Marks one request live (so Stop can cancel it) and waiting for its first token (for the
  // overload limit) for as long as it exists; cancels the engine request if it ends before
  // the engine said it finished (client gone, deadline, handler error).
  class InFlight {
   public:
    InFlight(Impl* impl, std::string id) : impl_(impl), id_(std::move(id)) {
      std::lock_guard lock(impl_->live_mu);
      impl_->live.insert(id_);
      impl_->waiting.fetch_add(1);
    }
    ~InFlight() {
      if (submitted_ && !finished_) impl_->model.engine->Cancel(id_);
      MarkFirstOutput();
      std::lock_guard lock(impl_->live_mu);
      impl_->live.erase(id_);
    }
    InFlight(const InFlight&) = delete;
    InFlight& operator=(const InFlight&) = delete;
    void MarkSubmitted() { submitted_ = true; }
    void MarkFirstOutput() {
      if (!first_output_) {
        first_output_ = true;
        impl_->waiting.fetch_sub(1);
      }
    }
    void MarkFinished() { finished_ = true; }

   private:
    Impl* impl_;
    std::string id_;
    bool submitted_ = false;
    bool first_output_ = false;
    bool finished_ = false;
  };

  // A validated request, tokenized, ready to submit.
  struct Prepared {
    GenerationRequest request;
    std::vector<int32_t> prompt;
    ResponseContext ctx;
  };

  // Per-request timing for the latency histograms; used by one handler thread.
  struct Timing {
    TimePoint arrival = Clock::now();
    TimePoint last_token{};
    bool any_token = false;
  };

  ParseLimits Limits() const {
    ParseLimits limits;
    limits.vocab_size = model.tokenizer ? model.tokenizer->vocab_size() : 0;
    return limits;
  }

  std::string ModelName() const { return options.served_model_name; }

  ApiResult<Prepared> Prepare(ApiKind kind, const std::string& body);
  Status Submit(const Prepared& p, const std::shared_ptr<OutputChannel>& channel);
  void Record(Timing& t, const RequestOutput& out);
  std::optional<ApiError> CheckOverload() const;

  void HandleGenerate(ApiKind kind, const httplib::Request& req, httplib::Response& res);
  void RespondWhole(Prepared p, httplib::Response& res);
  void RespondStream(Prepared p, httplib::Response& res);
  void HandleModels(httplib::Response& res);
  void HandleHealth(httplib::Response& res);
  void HandleMetrics(httplib::Response& res);
  void HandleTokenize(const httplib::Request& req, httplib::Response& res);
  void HandleDetokenize(const httplib::Request& req, httplib::Response& res);
  httplib::Server::HandlerResponse PreRoute(const httplib::Request& req, httplib::Response& res);

  NodeServerOptions options;
  ServerMetrics metrics;
  std::atomic<bool> ready{false};
  std::atomic<bool> stopping{false};
  ServedModel model;  // written once before ready is set
  std::unique_ptr<ChatPromptRenderer> chat;
  std::atomic<int> waiting{0};
  std::mutex live_mu;
  std::set<std::string> live;  // guarded by live_mu
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
  if (!r.model.empty() && r.model != ModelName()) {
    return ApiError{404, "invalid_request_error", "model_not_found",
                    fmt::format("The model '{}' does not exist", r.model), "model"};
  }
  if (kind == ApiKind::kChat) {
    Result<ChatPrompt> rendered = chat->Render(r.messages, r.tools, r.add_generation_prompt);
    if (!rendered.ok()) return BadRequest(rendered.status().message(), "messages");
    p.prompt = model.tokenizer->Encode(rendered->text, rendered->add_special);
  } else if (r.prompt_is_ids) {
    p.prompt = r.prompt_ids;
  } else {
    p.prompt = model.tokenizer->Encode(r.prompt_text, /*add_special=*/true);
  }
  const int prompt_len = static_cast<int>(p.prompt.size());
  if (prompt_len == 0) return BadRequest("the prompt is empty", "prompt");
  if (prompt_len >= model.max_model_len) {
    return ApiError{413, "invalid_request_error", "context_length_exceeded",
                    fmt::format("the prompt has {} tokens; this model's context is {} tokens",
                                prompt_len, model.max_model_len),
                    kind == ApiKind::kChat ? "messages" : "prompt"};
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
  if (stopping.load()) {
    return ApiError{503, "service_unavailable_error", "shutting_down", "the server is stopping",
                    ""};
  }
  if (waiting.load() >= options.max_waiting) {
    return ApiError{
        503, "service_unavailable_error", "server_overloaded",
        fmt::format("more than {} requests are waiting; retry later", options.max_waiting), ""};
  }
  return std::nullopt;
}

Status NodeServer::Impl::Submit(const Prepared& p, const std::shared_ptr<OutputChannel>& channel) {
  EngineRequest request;
  request.id = p.ctx.id;
  request.prompt = p.prompt;
  request.params = p.request.params;
  // The callback runs on the engine thread: it only queues.
  request.on_output = [channel](const RequestOutput& out) { channel->Push(out); };
  return model.engine->Submit(std::move(request));
}

void NodeServer::Impl::Record(Timing& t, const RequestOutput& out) {
  const TimePoint now = Clock::now();
  const int n = static_cast<int>(out.tokens.size());
  if (n > 0) {
    if (!t.any_token) {
      metrics.ObserveTimeToFirstToken(std::chrono::duration<double>(now - t.arrival).count());
      metrics.AddPromptTokens(out.prompt_tokens);
      for (int i = 1; i < n; ++i) metrics.ObserveInterTokenLatency(0.0);
    } else {
      const double gap = std::chrono::duration<double>(now - t.last_token).count() / n;
      for (int i = 0; i < n; ++i) metrics.ObserveInterTokenLatency(gap);
    }
    metrics.AddGenerationTokens(n);
    t.any_token = true;
    t.last_token = now;
  }
  if (out.finished) {
    metrics.ObserveE2eLatency(std::chrono::duration<double>(now - t.arrival).count());
    if (out.finish_reason == FinishReason::kStop || out.finish_reason == FinishReason::kLength) {
      metrics.RequestSucceeded(FinishReasonName(out.finish_reason));
    }
  }
}

void NodeServer::Impl::HandleGenerate(ApiKind kind, const httplib::Request& req,
                                      httplib::Response& res) {
  if (!ready.load(std::memory_order_acquire)) {
    return SendError(res, ApiError{503, "service_unavailable_error", "loading",
                                   "the model is still loading", ""});
  }
  if (auto e = CheckOverload()) return SendError(res, *e);
  ApiResult<Prepared> prepared = Prepare(kind, req.body);
  if (!prepared.ok()) return SendError(res, prepared.error());
  if (prepared.value().request.stream) {
    RespondStream(std::move(prepared.value()), res);
  } else {
    RespondWhole(std::move(prepared.value()), res);
  }
}

void NodeServer::Impl::RespondWhole(Prepared p, httplib::Response& res) {
  auto channel = std::make_shared<OutputChannel>();
  InFlight in_flight(this, p.ctx.id);
  if (Status s = Submit(p, channel); !s.ok()) return SendError(res, ApiErrorFromStatus(s));
  in_flight.MarkSubmitted();
  Timing timing;
  GenerationResult result;
  RequestOutput last;
  std::vector<RequestOutput> batch;
  Deadline idle = Deadline::After(std::chrono::seconds(options.request_timeout_s));
  while (!last.finished) {
    const Deadline slice(std::min(idle.at(), Clock::now() + kPollSlice));
    if (!channel->Wait(&batch, slice)) {
      // A request that slipped past Stop()'s sweep is cancelled here (Cancel is idempotent).
      if (stopping.load()) model.engine->Cancel(p.ctx.id);
      if (idle.Passed()) {
        return SendError(res, ApiError{504, "timeout_error", "timeout",
                                       "no output within the request timeout", ""});
      }
      continue;
    }
    idle = Deadline::After(std::chrono::seconds(options.request_timeout_s));
    for (RequestOutput& out : batch) {
      Record(timing, out);
      if (!out.tokens.empty()) in_flight.MarkFirstOutput();
      result.text += out.text;
      result.token_ids.insert(result.token_ids.end(), out.tokens.begin(), out.tokens.end());
      result.samples.insert(result.samples.end(), out.samples.begin(), out.samples.end());
      if (out.finished) last = std::move(out);
    }
  }
  in_flight.MarkFinished();
  if (last.finish_reason == FinishReason::kError) {
    return SendError(res, ApiErrorFromStatus(last.status));
  }
  if (last.finish_reason == FinishReason::kCancelled) {
    return SendError(res, ApiError{503, "service_unavailable_error", "cancelled",
                                   "the request was cancelled (server stopping)", ""});
  }
  result.finish_reason = FinishReasonName(last.finish_reason);
  result.prompt_tokens = static_cast<int>(p.prompt.size());
  result.completion_tokens = static_cast<int>(result.token_ids.size());
  res.set_content(FormatResponse(p.ctx, result), "application/json");
}

void NodeServer::Impl::RespondStream(Prepared p, httplib::Response& res) {
  // Everything the chunked provider needs lives here; httplib keeps the provider (and so this
  // state) until the response is written or the client is gone, then destroys it — and
  // InFlight's destructor cancels the engine request if it had not finished.
  struct StreamState {
    Prepared p;
    std::shared_ptr<OutputChannel> channel = std::make_shared<OutputChannel>();
    std::unique_ptr<InFlight> in_flight;
    Timing timing;
    bool opened = false;
    bool done = false;
    size_t text_offset = 0;
    int completion_tokens = 0;
    std::vector<RequestOutput> batch;
    Deadline idle = Deadline::Never();
  };
  auto st = std::make_shared<StreamState>();
  st->p = std::move(p);
  st->in_flight = std::make_unique<InFlight>(this, st->p.ctx.id);
  if (Status s = Submit(st->p, st->channel); !s.ok()) {
    return SendError(res, ApiErrorFromStatus(s));
  }
  st->in_flight->MarkSubmitted();
  st->idle = Deadline::After(std::chrono::seconds(options.request_timeout_s));
  const int timeout_s = options.request_timeout_s;
  auto provider = [this, st, timeout_s](size_t /*offset*/, httplib::DataSink& sink) -> bool {
    if (st->done) return true;
    const bool usage_null = st->p.request.include_usage;
    auto write = [&sink](const std::string& s) { return sink.write(s.data(), s.size()); };
    if (!st->opened) {
      st->opened = true;
      if (st->p.ctx.kind == ApiKind::kChat) {
        ChunkContent role;
        role.role_chunk = true;
        role.usage_null = usage_null;
        if (!write(SseEvent(FormatChunk(st->p.ctx, role, &st->text_offset)))) return false;
      }
    }
    const Deadline slice(std::min(st->idle.at(), Clock::now() + kPollSlice));
    if (!st->channel->Wait(&st->batch, slice)) {
      if (stopping.load()) model.engine->Cancel(st->p.ctx.id);
      if (!st->idle.Passed()) return true;
      const ApiError e{504, "timeout_error", "timeout", "no output within the request timeout", ""};
      st->done = true;
      bool ok = write(SseEvent(e.ToJson())) && write(kSseDone);
      sink.done();
      return ok;
    }
    st->idle = Deadline::After(std::chrono::seconds(timeout_s));
    for (RequestOutput& out : st->batch) {
      Record(st->timing, out);
      if (!out.tokens.empty()) st->in_flight->MarkFirstOutput();
      st->completion_tokens += static_cast<int>(out.tokens.size());
      if (out.finished) {
        st->in_flight->MarkFinished();
        st->done = true;
      }
      if (out.finish_reason == FinishReason::kError ||
          out.finish_reason == FinishReason::kCancelled) {
        const ApiError e = out.finish_reason == FinishReason::kError
                               ? ApiErrorFromStatus(out.status)
                               : ApiError{503, "service_unavailable_error", "cancelled",
                                          "the request was cancelled", ""};
        if (!write(SseEvent(e.ToJson()))) return false;
        break;
      }
      const bool is_chat = st->p.ctx.kind == ApiKind::kChat;
      const bool has_content = !out.text.empty() || (!out.tokens.empty() && !is_chat) ||
                               (!out.tokens.empty() && st->p.ctx.return_token_ids);
      if (has_content || (out.finished && !is_chat)) {
        ChunkContent c;
        c.text = out.text;
        c.token_ids = out.tokens;
        c.samples = out.samples;
        c.usage_null = usage_null;
        if (out.finished && !is_chat) c.finish_reason = FinishReasonName(out.finish_reason);
        if (!write(SseEvent(FormatChunk(st->p.ctx, c, &st->text_offset)))) return false;
      }
      if (out.finished && is_chat) {
        ChunkContent c;
        c.finish_reason = FinishReasonName(out.finish_reason);
        c.usage_null = usage_null;
        if (!write(SseEvent(FormatChunk(st->p.ctx, c, &st->text_offset)))) return false;
      }
      if (out.finished && st->p.request.include_usage) {
        const std::string usage = FormatUsageChunk(st->p.ctx, static_cast<int>(st->p.prompt.size()),
                                                   st->completion_tokens);
        if (!write(SseEvent(usage))) return false;
      }
    }
    if (st->done) {
      if (!write(kSseDone)) return false;
      sink.done();
    }
    return true;
  };
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", std::move(provider));
}

void NodeServer::Impl::HandleModels(httplib::Response& res) {
  json model_entry = {{"id", ModelName()},
                      {"object", "model"},
                      {"created", UnixSeconds()},
                      {"owned_by", "pdserve"}};
  if (ready.load()) model_entry["max_model_len"] = model.max_model_len;
  json j = {{"object", "list"}, {"data", json::array({model_entry})}};
  res.set_content(DumpJson(j), "application/json");
}

void NodeServer::Impl::HandleHealth(httplib::Response& res) {
  if (!ready.load() || stopping.load()) {
    res.status = 503;
    res.set_content(stopping.load() ? "stopping\n" : "loading\n", "text/plain");
    return;
  }
  res.set_content("ok\n", "text/plain");
}

void NodeServer::Impl::HandleMetrics(httplib::Response& res) {
  const EngineStats stats = ready.load() ? model.engine->stats() : EngineStats{};
  res.set_content(metrics.Render(stats), "text/plain; version=0.0.4");
}

void NodeServer::Impl::HandleTokenize(const httplib::Request& req, httplib::Response& res) {
  if (!ready.load()) {
    return SendError(res, ApiError{503, "service_unavailable_error", "loading",
                                   "the model is still loading", ""});
  }
  ApiResult<TokenizeRequest> parsed = ParseTokenizeRequest(req.body, Limits());
  if (!parsed.ok()) return SendError(res, parsed.error());
  TokenizeRequest& r = parsed.value();
  if (!r.model.empty() && r.model != ModelName()) {
    return SendError(res, ApiError{404, "invalid_request_error", "model_not_found",
                                   fmt::format("The model '{}' does not exist", r.model), "model"});
  }
  std::vector<int32_t> ids;
  if (r.is_chat) {
    Result<ChatPrompt> rendered = chat->Render(r.messages, nullptr, r.add_generation_prompt);
    if (!rendered.ok()) return SendError(res, BadRequest(rendered.status().message()));
    ids = model.tokenizer->Encode(rendered->text,
                                  r.add_special_tokens.value_or(rendered->add_special));
  } else {
    ids = model.tokenizer->Encode(r.prompt, r.add_special_tokens.value_or(true));
  }
  json j = {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", model.max_model_len}};
  res.set_content(DumpJson(j), "application/json");
}

void NodeServer::Impl::HandleDetokenize(const httplib::Request& req, httplib::Response& res) {
  if (!ready.load()) {
    return SendError(res, ApiError{503, "service_unavailable_error", "loading",
                                   "the model is still loading", ""});
  }
  ApiResult<std::vector<int32_t>> ids = ParseDetokenizeRequest(req.body, Limits());
  if (!ids.ok()) return SendError(res, ids.error());
  json j = {{"prompt", model.tokenizer->Decode(ids.value(), /*skip_special=*/false)}};
  res.set_content(DumpJson(j), "application/json");
}

httplib::Server::HandlerResponse NodeServer::Impl::PreRoute(const httplib::Request& req,
                                                            httplib::Response& res) {
  std::string id = req.get_header_value(kRequestIdHeader);
  if (!IsUsableRequestId(id)) id = "req-" + RandomHex(16);
  res.set_header(kRequestIdHeader, id);
  // /health and /metrics stay open so probes and scrapers need no key.
  if (!options.api_key.empty() && req.path != "/health" && req.path != "/metrics") {
    const std::string auth = req.get_header_value("Authorization");
    if (auth != "Bearer " + options.api_key) {
      SendError(res, ApiError{401, "invalid_request_error", "invalid_api_key",
                              "missing or invalid API key (Authorization: Bearer <key>)", ""});
      return httplib::Server::HandlerResponse::Handled;
    }
  }
  return httplib::Server::HandlerResponse::Unhandled;
}

NodeServer::NodeServer(NodeServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))),
      http_(std::make_unique<httplib::Server>()) {
  Impl* impl = impl_.get();
  const int threads = std::max(4, impl->options.http_threads);
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http_->set_payload_max_length(impl->options.max_body_bytes);
  http_->set_read_timeout(30, 0);
  http_->set_write_timeout(30, 0);
  http_->set_keep_alive_timeout(5);
  http_->set_tcp_nodelay(true);
  http_->set_pre_routing_handler([impl](const httplib::Request& req, httplib::Response& res) {
    return impl->PreRoute(req, res);
  });
  http_->Post("/v1/completions", [impl](const httplib::Request& req, httplib::Response& res) {
    impl->HandleGenerate(ApiKind::kCompletion, req, res);
  });
  http_->Post("/v1/chat/completions", [impl](const httplib::Request& req, httplib::Response& res) {
    impl->HandleGenerate(ApiKind::kChat, req, res);
  });
  http_->Get("/v1/models",
             [impl](const httplib::Request&, httplib::Response& res) { impl->HandleModels(res); });
  http_->Get("/health",
             [impl](const httplib::Request&, httplib::Response& res) { impl->HandleHealth(res); });
  http_->Get("/metrics",
             [impl](const httplib::Request&, httplib::Response& res) { impl->HandleMetrics(res); });
  http_->Post("/tokenize", [impl](const httplib::Request& req, httplib::Response& res) {
    impl->HandleTokenize(req, res);
  });
  http_->Post("/detokenize", [impl](const httplib::Request& req, httplib::Response& res) {
    impl->HandleDetokenize(req, res);
  });
  // Statuses httplib sets itself (404 route, 413 body, 400 parse) get the OpenAI error body.
  http_->set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request&, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        SendError(res, ErrorForHttpStatus(res.status));
        return httplib::Server::HandlerResponse::Handled;
      }));
  http_->set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown exception";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        PD_LOG_ERROR("handler exception: {}", what);
        SendError(res, ApiError{500, "internal_error", "internal_error", what, ""});
      });
  http_->set_logger([impl](const httplib::Request& req, const httplib::Response& res) {
    if (res.status >= 400) impl->metrics.RequestFailed(res.status);
    PD_LOG_INFO("request_id={} method={} path={} status={} remote={} bytes_in={}",
                res.get_header_value(kRequestIdHeader), req.method, req.path, res.status,
                req.remote_addr, req.body.size());
  });
}

NodeServer::~NodeServer() { Stop(); }

Status NodeServer::Bind() {
  const NodeServerOptions& o = impl_->options;
  if (o.port == 0) {
    const int port = http_->bind_to_any_port(o.host);
    if (port <= 0) return Status::Unavailable(fmt::format("cannot bind {}:<any>", o.host));
    bound_port_ = port;
  } else {
    if (!http_->bind_to_port(o.host, o.port)) {
      return Status::Unavailable(fmt::format("cannot bind {}:{} (in use?)", o.host, o.port));
    }
    bound_port_ = o.port;
  }
  RaiseListenBacklog(bound_port_, 1024);
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
  PD_ASSIGN_OR_RETURN(
      impl_->chat, ChatPromptRenderer::Create(
                       {tokenizer.chat_template(), tokenizer.bos_token(), tokenizer.eos_token()}));
  impl_->model = std::move(model);
  impl_->model.engine->Start();
  impl_->ready.store(true, std::memory_order_release);
  return Status::Ok();
}

void NodeServer::Stop() {
  if (stopped_.exchange(true)) return;
  impl_->stopping.store(true);
  if (impl_->ready.load()) {
    std::vector<std::string> ids;
    {
      std::lock_guard lock(impl_->live_mu);
      ids.assign(impl_->live.begin(), impl_->live.end());
    }
    for (const std::string& id : ids) impl_->model.engine->Cancel(id);
  }
  http_->stop();
  if (listen_thread_.joinable()) listen_thread_.join();
  if (impl_->model.engine) impl_->model.engine->Stop();
}

}  // namespace pdserve::server
