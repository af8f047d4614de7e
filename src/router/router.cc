#include "router/router.h"

#include <sys/socket.h>

#include <cerrno>
#include <csignal>
#include <optional>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/logging.h"
#include "common/metrics_text.h"
#include "http/node_client.h"
#include "http/registration_body.h"
#include "http/request_id.h"
#include "http/server.h"
#include "http/server_setup.h"
#include "http/sse.h"

namespace pdserve::router {

namespace {

using http::ApiError;
using http::kRequestIdHeader;
using http::SendError;

// Headers a node needs from the client; everything else (hop-by-hop, encodings) stays here.
constexpr const char* kForwardedHeaders[] = {"Content-Type", "Accept", "Authorization",
                                             "User-Agent"};
constexpr const char* kReturnedHeaders[] = {"Retry-After", "Cache-Control"};
constexpr auto kRelayPollInterval = std::chrono::milliseconds(200);
constexpr size_t kErrorBodyLimit = 64 << 10;

ApiError NoHealthyNode(std::string message) {
  return ApiError::Unavailable(std::move(message), "no_healthy_node");
}

ApiError ShuttingDown() { return ApiError::Unavailable("the router is stopping", "shutting_down"); }

bool IsRetryableStatus(int status) { return status == 429 || status >= 500; }

// What a node's prefix cache would see of a request, cut into 64-byte blocks for the prefix
// index: a completion's prompt (text, or token ids as little-endian u32: 16 per block), a chat's
// messages (role and content of each, in order: the chat template puts the same history first).
// Nothing for other bodies, lists of prompts, or a body that is not JSON (the node refuses it).
std::vector<uint64_t> PromptBlocks(std::string_view path, const std::string& body) {
  constexpr size_t kBlockBytes = 64;
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return {};
  std::string key;
  if (path == "/v1/completions") {
    const auto prompt = j.find("prompt");
    if (prompt == j.end()) return {};
    if (prompt->is_string()) {
      key = prompt->get<std::string>();
    } else if (prompt->is_array() && !prompt->empty() && (*prompt)[0].is_number_integer()) {
      for (const auto& id : *prompt) {
        if (!id.is_number_integer()) return {};
        const auto v = static_cast<uint32_t>(id.get<int64_t>());
        for (int b = 0; b < 4; ++b) key.push_back(static_cast<char>((v >> (8 * b)) & 0xff));
      }
    }
  } else if (path == "/v1/chat/completions") {
    const auto messages = j.find("messages");
    if (messages == j.end() || !messages->is_array()) return {};
    for (const auto& m : *messages) {
      if (!m.is_object()) return {};
      key += m.value("role", "");
      key.push_back('\0');
      const auto content = m.find("content");
      if (content != m.end())
        key += content->is_string() ? content->get<std::string>() : content->dump();
      key.push_back('\0');
    }
  }
  return ChainBlockHashes(key, kBlockBytes);
}

bool IsEventStream(const UpstreamHead& head) {
  auto it = head.headers.find("Content-Type");
  return it != head.headers.end() && it->second.starts_with("text/event-stream");
}

std::string HeaderOr(const httplib::Headers& headers, const char* key, const char* fallback) {
  auto it = headers.find(key);
  return it == headers.end() ? fallback : it->second;
}

void CopyReturnedHeaders(const UpstreamHead& head, httplib::Response& res) {
  for (const char* key : kReturnedHeaders) {
    if (auto it = head.headers.find(key); it != head.headers.end()) {
      res.set_header(key, it->second);
    }
  }
}

}  // namespace

Result<std::unique_ptr<Router>> Router::Create(RouterOptions options) {
  if (options.max_attempts < 1) return Status::InvalidArgument("max_attempts must be >= 1");
  if (options.http_threads < 2) return Status::InvalidArgument("http_threads must be >= 2");
  if (options.port < 0 || options.port > 65535) {
    return Status::InvalidArgument("port " + std::to_string(options.port) + " out of range");
  }
  if (options.max_body_bytes == 0) return Status::InvalidArgument("max_body_bytes must be > 0");
  std::unique_ptr<Router> router(new Router(std::move(options)));
  for (const std::string& url : router->options_.nodes) {
    PD_RETURN_IF_ERROR(router->pool_.AddStatic(url));
  }
  return router;
}

Router::Router(RouterOptions options)
    : options_(std::move(options)),
      pool_(options_.pool),
      prefixes_(options_.prefix_index_blocks),
      connections_(options_.upstream_connections) {}

Router::~Router() { Stop(); }

Status Router::Start() {
  if (started_) return Status::FailedPrecondition("router already started");
  // A write to a client or node that went away must fail with EPIPE, not kill the process.
  std::signal(SIGPIPE, SIG_IGN);
  http::ServerConfig config;
  config.threads = options_.http_threads;
  config.max_body_bytes = options_.max_body_bytes;
  config.api_key = options_.api_key;
  config.cluster_key = options_.cluster_key;
  config.max_connections = options_.max_connections;
  config.header_timeout = std::chrono::seconds(options_.header_timeout_s);
  http::ConfigureServer(server_, config);
  InstallRoutes();
  Result<std::unique_ptr<RelayLoop>> relay = RelayLoop::Start(
      RelayOptions{.silence = options_.upstream.read, .client_stall = options_.client_stall});
  if (!relay.ok()) return relay.status();
  relay_ = std::move(*relay);
  Result<int> port = http::BindServer(server_, options_.host, options_.port, config);
  if (!port.ok()) return port.status();
  port_ = *port;
  started_ = true;
  listen_thread_ = std::thread([this] { server_.listen_after_bind(); });
  health_thread_ = std::thread([this] { HealthLoop(); });
  // listen_after_bind sets is_running() before its accept loop; the socket already listens.
  const Deadline ready = Deadline::AfterMs(5000);
  while (!server_.is_running() && !ready.Passed()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  PD_LOG_INFO("router listening on http://{}:{} with {} node(s)", options_.host, port_,
              pool_.Size());
  return Status::Ok();
}

void Router::BeginDrain() {
  if (!draining_.exchange(true)) PD_LOG_INFO("router: draining (new requests get 503)");
}

void Router::FinishDrain(Deadline deadline) {
  BeginDrain();
  while (in_flight_.load() > 0 && !deadline.Passed()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const int left = in_flight_.load();
  if (left == 0) return;
  PD_LOG_WARN("router: grace period over, ending {} request(s) in flight", left);
  abort_in_flight_.store(true);
  relay_->AbortAll();
  // Each relay and read notices within a poll interval and ends its request properly; a
  // client that does not read its last bytes is bounded by the write timeout, not waited for.
  const Deadline ended = Deadline::AfterMs(5000);
  while (in_flight_.load() > 0 && !ended.Passed()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void Router::Stop() {
  if (!started_ || stopping_.exchange(true)) return;
  WakeHealthLoop();
  relay_->AbortAll();  // the handlers of open streams return, and the server can stop
  server_.stop();
  if (listen_thread_.joinable()) listen_thread_.join();
  if (health_thread_.joinable()) health_thread_.join();
}

void Router::InstallRoutes() {
  auto forward = [this](const httplib::Request& req, httplib::Response& res) {
    HandleForward(req, res);
  };
  std::vector<http::PostRoute> posts;
  for (const char* path : {"/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"}) {
    posts.push_back({path, forward});
  }
  posts.push_back(
      {"/internal/register",
       [this](const httplib::Request& req, httplib::Response& res) { HandleRegister(req, res); }});
  http::AddPostRoutes(server_, std::move(posts));
  server_.Get("/v1/models", forward);
  server_.Get("/v1/models/(.+)", forward);
  server_.Get("/health",
              [this](const httplib::Request&, httplib::Response& res) { HandleHealth(res); });
  server_.Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) {
    HandleMetrics(req, res);
  });
}

void Router::HandleForward(const httplib::Request& req, httplib::Response& res) {
  const TimePoint start = Clock::now();
  const std::string request_id = http::RequestIdOf(res);
  ++in_flight_;  // Finish counts it down
  if (draining_.load()) {
    SendError(res, ShuttingDown());
    Finish(request_id, req, start, Outcome{"-", res.status, 0, res.body.size(), "shutdown"});
    return;
  }
  // Only POST routes take a body: a GET's (http::Server read it whole) goes no further.
  UpstreamRequest upstream{req.method,
                           req.target.empty() ? req.path : req.target,
                           {},
                           req.method == "POST" ? req.body : std::string()};
  for (const char* key : kForwardedHeaders) {
    if (req.has_header(key)) upstream.headers.emplace(key, req.get_header_value(key));
  }
  upstream.headers.emplace(kRequestIdHeader, request_id);

  Outcome outcome;
  outcome.node = "-";
  std::vector<std::string> tried;
  // What the last failed attempt would tell the client if no node does better. It is kept
  // apart from `res` and copied there only once every attempt failed: a retry that succeeds
  // must carry nothing of it (no second Content-Type, no stale body or Retry-After).
  std::optional<httplib::Response> failure;
  // Routing by prefix: each node's cost is lowered by up to prefix_weight outstanding
  // requests, in proportion to the share of the prompt's blocks it was sent before.
  const std::vector<uint64_t> blocks = options_.prefix_weight > 0 && req.method == "POST"
                                           ? PromptBlocks(req.path, upstream.body)
                                           : std::vector<uint64_t>();
  std::function<double(const std::string&)> prefix_bonus;
  if (!blocks.empty()) {
    prefix_bonus = [this, &blocks](const std::string& url) {
      return options_.prefix_weight * static_cast<double>(prefixes_.Match(url, blocks)) /
             static_cast<double>(blocks.size());
    };
  }
  for (int attempt = 0; attempt < options_.max_attempts && !abort_in_flight_.load(); ++attempt) {
    std::optional<NodeAddress> node = pool_.Acquire(tried, prefix_bonus);
    if (!node.has_value()) break;
    if (!blocks.empty()) prefixes_.Record(node->url, blocks);
    if (attempt > 0) ++retries_;
    tried.push_back(node->url);
    outcome.node = node->url;
    outcome.attempts = attempt + 1;
    failure.emplace();
    auto exchange = UpstreamExchange::Start(*node, upstream, options_.upstream, &connections_);
    Result<UpstreamHead> head = WaitHeadOrAbort(*exchange);
    if (!head.ok()) {
      if (exchange->connect_failed()) pool_.ReportConnectFailure(node->url);
      pool_.Release(node->url);
      if (head.status().code() == StatusCode::kCancelled) break;
      if (head.status().code() == StatusCode::kDeadlineExceeded) {
        // The node took the request and went silent: it may still run it, so no retry.
        SendError(*failure, ApiError::Timeout(head.status().message(), "upstream_timeout"));
        break;
      }
      SendError(*failure, ApiError::BadGateway(head.status().message(), "upstream_unreachable"));
      continue;
    }
    if (IsRetryableStatus(head->status)) {
      // Nothing reached the client yet: keep the node's answer in case no other node does
      // better, and try the next one.
      Result<std::string> body = exchange->ReadAll(Deadline::AfterMs(2000), kErrorBodyLimit);
      pool_.Release(node->url);
      failure->status = head->status;
      failure->set_content(body.ok() ? *body : "",
                           HeaderOr(head->headers, "Content-Type", "application/json"));
      CopyReturnedHeaders(*head, *failure);
      continue;
    }
    if (IsEventStream(*head)) {
      StartRelay(std::move(exchange), *head, request_id, req, start, outcome.attempts, res);
      return;
    }
    Result<std::string> body = exchange->ReadAll(Deadline::After(options_.upstream.read),
                                                 options_.max_response_bytes, &abort_in_flight_);
    pool_.Release(node->url);
    if (!body.ok()) {
      // Broken before the client saw a byte: another node may still answer.
      SendError(*failure, ApiError::BadGateway(body.status().message(), "upstream_broken"));
      continue;
    }
    failure.reset();
    res.status = head->status;
    res.set_content(std::move(*body), HeaderOr(head->headers, "Content-Type", "application/json"));
    CopyReturnedHeaders(*head, res);
    break;
  }
  const bool aborted = abort_in_flight_.load() && (outcome.attempts == 0 || failure.has_value());
  if (aborted) {
    failure.emplace();
    SendError(*failure, ShuttingDown());
  } else if (outcome.attempts == 0 ||
             (failure.has_value() && failure->status == 502 && pool_.HealthyCount() == 0)) {
    ++no_healthy_node_;
    failure.emplace();
    SendError(*failure, NoHealthyNode("no healthy node to serve the request"));
  }
  if (failure.has_value()) {
    res.status = failure->status;
    for (const auto& [key, value] : failure->headers) res.set_header(key, value);
    res.body = std::move(failure->body);
  }
  outcome.status = res.status;
  outcome.bytes = res.body.size();
  outcome.note = aborted ? "shutdown" : failure.has_value() ? "failed" : "ok";
  Finish(request_id, req, start, outcome);
}

Result<UpstreamHead> Router::WaitHeadOrAbort(UpstreamExchange& exchange) {
  const Deadline deadline = Deadline::After(options_.upstream.read);
  for (;;) {
    const Deadline slice(std::min(deadline.at(), Clock::now() + kRelayPollInterval));
    Result<UpstreamHead> head = exchange.WaitHead(slice);
    if (head.ok() || head.status().code() != StatusCode::kDeadlineExceeded || deadline.Passed()) {
      return head;
    }
    if (abort_in_flight_.load()) {
      exchange.Cancel();
      return Status::Cancelled(exchange.node().url + ": abandoned (router stopping)");
    }
  }
}

void Router::StartRelay(std::shared_ptr<UpstreamExchange> exchange, const UpstreamHead& head,
                        const std::string& request_id, const httplib::Request& req, TimePoint start,
                        int attempts, httplib::Response& res) {
  res.status = head.status;
  CopyReturnedHeaders(head, res);
  struct RelayState {
    RelayEnd end;
    bool shutdown = false;
  };
  auto state = std::make_shared<RelayState>();
  auto provider = [this, exchange, state](size_t, httplib::DataSink& sink) {
    // Ends the stream so that a client reads an error rather than a cut: the error event (none
    // after the node's own [DONE]), then [DONE]. False if the client is gone.
    auto end_with = [&](const ApiError& error) {
      const std::string tail = state->end.saw_done ? "" : http::SseError(error) + http::kSseDone;
      if (!tail.empty() && !sink.write(tail.data(), tail.size())) return false;
      sink.done();
      return true;
    };
    const int client_fd = http::CurrentClientSocket();
    if (abort_in_flight_.load() || client_fd < 0) {
      state->shutdown = true;
      exchange->Cancel();
      return end_with(ShuttingDown());
    }
    // The whole body, on the relay's thread; this one sleeps until it ended.
    state->end = relay_->Relay(*exchange, client_fd);
    switch (state->end.reason) {
      case RelayEnd::Reason::kComplete:
        sink.done();
        return true;
      case RelayEnd::Reason::kClientGone:
        return false;
      case RelayEnd::Reason::kAborted:
        state->shutdown = true;
        return end_with(ShuttingDown());
      case RelayEnd::Reason::kUpstreamSilent:
        return end_with(
            ApiError::Timeout(exchange->node().url + ": " + state->end.detail, "upstream_timeout"));
      case RelayEnd::Reason::kUpstreamBroken:
        // Bytes were sent already: no retry, but the client learns why the stream ends.
        return end_with(ApiError::BadGateway(
            exchange->node().url + ": stream broken: " + state->end.detail, "upstream_broken"));
    }
    return false;
  };
  // Runs when httplib drops the response: after the last chunk or when the client went away.
  auto releaser = [this, exchange, state, request_id, method = req.method, path = req.path, start,
                   attempts, status = head.status](bool success) {
    exchange->Cancel();  // no-op if the node finished; closes its connection otherwise
    pool_.Release(exchange->node().url);
    Outcome outcome{exchange->node().url, status, attempts, state->end.bytes, "ok"};
    if (state->shutdown) {
      outcome.note = "shutdown";
    } else if (state->end.reason == RelayEnd::Reason::kUpstreamBroken ||
               state->end.reason == RelayEnd::Reason::kUpstreamSilent) {
      outcome.note = "upstream_broken";
    } else if (!success) {
      outcome.note = "client_gone";
      ++client_disconnects_;
    } else if (state->end.upstream_error) {
      outcome.note = "upstream_error";
    }
    httplib::Request fake;
    fake.method = method;
    fake.path = path;
    Finish(request_id, fake, start, outcome);
  };
  res.set_chunked_content_provider(HeaderOr(head.headers, "Content-Type", "text/event-stream"),
                                   std::move(provider), std::move(releaser));
}

void Router::Finish(const std::string& request_id, const httplib::Request& req, TimePoint start,
                    const Outcome& outcome) {
  {
    MutexLock lock(&metrics_mu_);
    ++responses_by_status_[outcome.status];
  }
  PD_LOG_INFO(
      "router request_id={} method={} path={} node={} status={} attempts={} bytes={} "
      "latency_ms={:.1f} outcome={}",
      request_id, req.method, req.path, outcome.node, outcome.status, outcome.attempts,
      outcome.bytes, SecondsSince(start) * 1e3, outcome.note);
  --in_flight_;
}

void Router::HandleHealth(httplib::Response& res) {
  if (draining_.load()) {
    SendError(res, ApiError::Unavailable("the router is stopping", "draining"));
    return;
  }
  const int healthy = pool_.HealthyCount();
  if (healthy == 0) {
    SendError(res, NoHealthyNode("no healthy node"));
    return;
  }
  // "degraded" when every node that takes traffic says it serves below its role (e.g. decode
  // nodes with no usable prefill peer prefill locally): requests are answered, more slowly.
  const int degraded = pool_.DegradedCount();
  nlohmann::json body = {{"status", degraded == healthy ? "degraded" : "ok"},
                         {"healthy_nodes", healthy},
                         {"degraded_nodes", degraded},
                         {"nodes", pool_.Size()}};
  res.set_content(body.dump(), "application/json");
}

void Router::HandleMetrics(const httplib::Request& req, httplib::Response& res) {
  // /metrics needs no key, but with one set a scrape without it must not learn where the
  // nodes listen (their ports would bypass the router): nodes are then named by position.
  const bool show_urls = http::HasApiKey(req, options_.api_key);
  MetricsText out;
  out.Family("pdserve:router_requests_total", MetricType::kCounter,
             "Requests answered, by HTTP status.");
  {
    MutexLock lock(&metrics_mu_);
    for (const auto& [status, count] : responses_by_status_) {
      out.Sample("pdserve:router_requests_total", {{"status", std::to_string(status)}},
                 static_cast<double>(count));
    }
  }
  out.Counter("pdserve:router_retries_total", "Requests sent again to another node.",
              static_cast<double>(retries_.load()))
      .Counter("pdserve:router_no_healthy_node_total", "Requests refused: no healthy node.",
               static_cast<double>(no_healthy_node_.load()))
      .Counter("pdserve:router_client_disconnects_total",
               "Streams whose client left before the end.",
               static_cast<double>(client_disconnects_.load()));
  const UpstreamConnectionStats connections = connections_.stats();
  out.Counter("pdserve:router_node_connections_opened_total",
              "Connections opened to nodes for requests.", static_cast<double>(connections.opened))
      .Counter("pdserve:router_node_connections_reused_total",
               "Requests sent on an idle connection kept from an earlier request.",
               static_cast<double>(connections.reused))
      .Gauge("pdserve:router_node_connections_idle", "Idle connections to nodes kept for reuse.",
             static_cast<double>(connections.idle));
  std::vector<NodeSnapshot> nodes = pool_.Snapshot();
  if (!show_urls) {
    for (size_t i = 0; i < nodes.size(); ++i) nodes[i].url = "node" + std::to_string(i);
  }
  // One family per property, a sample per node.
  auto per_node = [&](const char* name, MetricType type, const char* help, auto value) {
    out.Family(name, type, help);
    for (const NodeSnapshot& n : nodes) {
      out.Sample(name, {{"node", n.url}}, static_cast<double>(value(n)));
    }
  };
  per_node("pdserve:router_node_healthy", MetricType::kGauge, "1 if the node gets traffic.",
           [](const NodeSnapshot& n) { return n.healthy ? 1 : 0; });
  per_node("pdserve:router_node_degraded", MetricType::kGauge,
           "1 if the node says it serves below its role (/health \"degraded: ...\").",
           [](const NodeSnapshot& n) { return n.degraded.empty() ? 0 : 1; });
  per_node("pdserve:router_node_outstanding_requests", MetricType::kGauge,
           "Requests in flight on the node.", [](const NodeSnapshot& n) { return n.outstanding; });
  per_node("pdserve:router_node_requests_total", MetricType::kCounter, "Requests sent to the node.",
           [](const NodeSnapshot& n) { return n.requests; });
  out.Gauge("pdserve:router_nodes", "Nodes the router knows (static, registered or members).",
            static_cast<double>(nodes.size()));
  if (options_.extra_metrics) options_.extra_metrics(out);
  res.set_content(out.text(), "text/plain; version=0.0.4");
}

void Router::HandleRegister(const httplib::Request& req, httplib::Response& res) {
  http::ApiResult<NodeAddress> node = http::ParseRegistrationBody(req.body);
  if (!node.ok()) {
    SendError(res, node.error());
    return;
  }
  Result<bool> added = pool_.Register(node.value().url);
  if (!added.ok()) {
    SendError(res,
              ApiError::InvalidRequest(added.status().message(), "url", "invalid_registration"));
    return;
  }
  if (*added) {
    // The cluster proof was checked before routing (http/server_setup.h).
    PD_LOG_INFO("router: node {} registered", node.value().url);
    WakeHealthLoop();  // check the new node now rather than at the next tick
  }
  nlohmann::json reply = {{"registered", true}, {"new", *added}, {"nodes", pool_.Size()}};
  res.set_content(reply.dump(), "application/json");
}

void Router::SetMembers(const std::vector<std::string>& urls) {
  if (pool_.SetMembers(urls)) WakeHealthLoop();  // check new members now
  ForgetRemovedNodes();
}

void Router::ForgetRemovedNodes() {
  for (const std::string& url : pool_.TakeRemoved()) prefixes_.Forget(url);
}

void Router::HealthLoop() {
  while (!stopping_.load()) {
    CheckAllNodes();
    pool_.ExpireRegistrations();
    ForgetRemovedNodes();
    connections_.CloseStale();
    WaitForHealthTick(Clock::now() + options_.health_interval);
  }
}

void Router::WakeHealthLoop() {
  {
    MutexLock lock(&health_mu_);
    health_wake_ = true;
  }
  health_cv_.NotifyAll();
}

void Router::WaitForHealthTick(TimePoint deadline) {
  MutexLock lock(&health_mu_);
  while (!health_wake_) {
    if (health_cv_.WaitUntil(&health_mu_, deadline) == std::cv_status::timeout) break;
  }
  health_wake_ = false;
}

void Router::CheckAllNodes() {
  http::NodeCallOptions options;
  options.connect_timeout = options_.health_timeout;
  options.timeout = options_.health_timeout;
  for (const NodeAddress& node : pool_.Addresses()) {
    if (stopping_.load()) return;
    Result<std::string> health = http::NodeGetOk(node, "/health", options);
    if (health.ok()) {
      // A node serving below its role says so: "degraded: <why>".
      constexpr std::string_view kDegraded = "degraded: ";
      std::string degraded;
      if (std::string_view(*health).substr(0, kDegraded.size()) == kDegraded) {
        degraded = health->substr(kDegraded.size());
        while (!degraded.empty() && (degraded.back() == '\n' || degraded.back() == '\r')) {
          degraded.pop_back();
        }
      }
      if (pool_.ReportHealthy(node.url, degraded)) {
        if (degraded.empty()) {
          PD_LOG_INFO("router: node {} is healthy", node.url);
        } else {
          PD_LOG_WARN("router: node {} is degraded: {}", node.url, degraded);
        }
      }
    } else if (pool_.ReportUnhealthy(node.url)) {
      PD_LOG_WARN("router: node {} is down (health checks failing)", node.url);
      prefixes_.Forget(node.url);  // it may come back restarted, its cache empty
    }
  }
}

}  // namespace pdserve::router
