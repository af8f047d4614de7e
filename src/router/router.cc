#include "router/router.h"

#include <csignal>
#include <optional>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/logging.h"
#include "http/request_id.h"
#include "http/server_setup.h"

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

bool IsRetryableStatus(int status) { return status == 429 || status >= 500; }

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

Router::Router(RouterOptions options) : options_(std::move(options)), pool_(options_.pool) {}

Router::~Router() { Stop(); }

Status Router::Start() {
  if (started_) return Status::FailedPrecondition("router already started");
  // A write to a client or node that went away must fail with EPIPE, not kill the process.
  std::signal(SIGPIPE, SIG_IGN);
  http::ServerConfig config;
  config.threads = options_.http_threads;
  config.max_body_bytes = options_.max_body_bytes;
  config.api_key = options_.api_key;
  config.max_connections = options_.max_connections;
  config.header_timeout = std::chrono::seconds(options_.header_timeout_s);
  http::ConfigureServer(server_, config);
  InstallRoutes();
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

void Router::Stop() {
  if (!started_ || stopping_.exchange(true)) return;
  WakeHealthLoop();
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
  http::AddPostRoutes(server_, options_.max_body_bytes, std::move(posts));
  server_.Get("/v1/models", forward);
  server_.Get("/v1/models/(.+)", forward);
  server_.Get("/health",
              [this](const httplib::Request&, httplib::Response& res) { HandleHealth(res); });
  server_.Get("/metrics",
              [this](const httplib::Request&, httplib::Response& res) { HandleMetrics(res); });
}

void Router::HandleForward(const httplib::Request& req, httplib::Response& res) {
  const TimePoint start = Clock::now();
  const std::string request_id = http::RequestIdOf(res);
  UpstreamRequest upstream{req.method, req.target.empty() ? req.path : req.target, {}, req.body};
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
  for (int attempt = 0; attempt < options_.max_attempts; ++attempt) {
    std::optional<NodeAddress> node = pool_.Acquire(tried);
    if (!node.has_value()) break;
    if (attempt > 0) ++retries_;
    tried.push_back(node->url);
    outcome.node = node->url;
    outcome.attempts = attempt + 1;
    failure.emplace();
    auto exchange = UpstreamExchange::Start(*node, upstream, options_.upstream);
    Result<UpstreamHead> head = exchange->WaitHead(Deadline::After(options_.upstream.read));
    if (!head.ok()) {
      if (exchange->connect_failed()) pool_.ReportConnectFailure(node->url);
      pool_.Release(node->url);
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
    Result<std::string> body =
        exchange->ReadAll(Deadline::After(options_.upstream.read), options_.max_response_bytes);
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
  if (outcome.attempts == 0 ||
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
  outcome.note = failure.has_value() ? "failed" : "ok";
  Finish(request_id, req, start, outcome);
}

void Router::StartRelay(std::shared_ptr<UpstreamExchange> exchange, const UpstreamHead& head,
                        const std::string& request_id, const httplib::Request& req, TimePoint start,
                        int attempts, httplib::Response& res) {
  res.status = head.status;
  CopyReturnedHeaders(head, res);
  struct RelayState {
    size_t bytes = 0;
    bool upstream_broken = false;
  };
  auto state = std::make_shared<RelayState>();
  auto provider = [exchange, state](size_t, httplib::DataSink& sink) {
    std::string piece;
    switch (exchange->Pop(&piece, Deadline::After(kRelayPollInterval))) {
      case UpstreamExchange::Next::kData:
        state->bytes += piece.size();
        // A false write means the client is gone; returning false ends the response.
        return piece.empty() || sink.write(piece.data(), piece.size());
      case UpstreamExchange::Next::kEnd:
        sink.done();
        return true;
      case UpstreamExchange::Next::kTimeout:
        return true;  // httplib calls again after checking the client socket
      case UpstreamExchange::Next::kError:
        // Bytes were sent already: no retry; cutting the chunked stream tells the client.
        state->upstream_broken = true;
        return false;
    }
    return false;
  };
  // Runs when httplib drops the response: after the last chunk or when the client went away.
  auto releaser = [this, exchange, state, request_id, method = req.method, path = req.path, start,
                   attempts, status = head.status](bool success) {
    exchange->Cancel();  // no-op if the node finished; closes its connection otherwise
    pool_.Release(exchange->node().url);
    Outcome outcome{exchange->node().url, status, attempts, state->bytes, "ok"};
    if (state->upstream_broken) {
      outcome.note = "upstream_broken";
    } else if (!success) {
      outcome.note = "client_gone";
      ++client_disconnects_;
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
}

void Router::HandleHealth(httplib::Response& res) {
  const int healthy = pool_.HealthyCount();
  if (healthy == 0) {
    SendError(res, NoHealthyNode("no healthy node"));
    return;
  }
  nlohmann::json body = {{"status", "ok"}, {"healthy_nodes", healthy}, {"nodes", pool_.Size()}};
  res.set_content(body.dump(), "application/json");
}

void Router::HandleMetrics(httplib::Response& res) {
  std::ostringstream out;
  auto header = [&](const char* name, const char* type, const char* help) {
    out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
  };
  header("pdserve:router_requests_total", "counter", "Requests answered, by HTTP status.");
  {
    MutexLock lock(&metrics_mu_);
    for (const auto& [status, count] : responses_by_status_) {
      out << "pdserve:router_requests_total{status=\"" << status << "\"} " << count << '\n';
    }
  }
  header("pdserve:router_retries_total", "counter", "Requests sent again to another node.");
  out << "pdserve:router_retries_total " << retries_.load() << '\n';
  header("pdserve:router_no_healthy_node_total", "counter", "Requests refused: no healthy node.");
  out << "pdserve:router_no_healthy_node_total " << no_healthy_node_.load() << '\n';
  header("pdserve:router_client_disconnects_total", "counter",
         "Streams whose client left before the end.");
  out << "pdserve:router_client_disconnects_total " << client_disconnects_.load() << '\n';
  const std::vector<NodeSnapshot> nodes = pool_.Snapshot();
  header("pdserve:router_node_healthy", "gauge", "1 if the node gets traffic.");
  for (const NodeSnapshot& n : nodes) {
    out << "pdserve:router_node_healthy{node=\"" << n.url << "\"} " << (n.healthy ? 1 : 0) << '\n';
  }
  header("pdserve:router_node_outstanding_requests", "gauge", "Requests in flight on the node.");
  for (const NodeSnapshot& n : nodes) {
    out << "pdserve:router_node_outstanding_requests{node=\"" << n.url << "\"} " << n.outstanding
        << '\n';
  }
  header("pdserve:router_node_requests_total", "counter", "Requests sent to the node.");
  for (const NodeSnapshot& n : nodes) {
    out << "pdserve:router_node_requests_total{node=\"" << n.url << "\"} " << n.requests << '\n';
  }
  res.set_content(out.str(), "text/plain; version=0.0.4");
}

void Router::HandleRegister(const httplib::Request& req, httplib::Response& res) {
  nlohmann::json body = nlohmann::json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (!body.is_object() || !body.contains("url") || !body["url"].is_string()) {
    SendError(res, ApiError::InvalidRequest("expected {\"url\": \"http://host:port\"}", "url",
                                            "invalid_registration"));
    return;
  }
  Result<bool> added = pool_.Register(body["url"].get<std::string>());
  if (!added.ok()) {
    SendError(res,
              ApiError::InvalidRequest(added.status().message(), "url", "invalid_registration"));
    return;
  }
  if (*added) {
    PD_LOG_INFO("router: node {} registered", body["url"].get<std::string>());
    WakeHealthLoop();  // check the new node now rather than at the next tick
  }
  nlohmann::json reply = {{"registered", true}, {"new", *added}, {"nodes", pool_.Size()}};
  res.set_content(reply.dump(), "application/json");
}

void Router::HealthLoop() {
  while (!stopping_.load()) {
    CheckAllNodes();
    pool_.ExpireRegistrations();
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
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(options_.health_timeout);
  const time_t sec = static_cast<time_t>(us.count() / 1000000);
  const time_t usec = static_cast<time_t>(us.count() % 1000000);
  for (const NodeAddress& node : pool_.Addresses()) {
    if (stopping_.load()) return;
    httplib::Client client(node.host, node.port);
    client.set_connection_timeout(sec, usec);
    client.set_read_timeout(sec, usec);
    httplib::Result result = client.Get("/health");
    if (result && result->status == 200) {
      if (pool_.ReportHealthy(node.url)) PD_LOG_INFO("router: node {} is healthy", node.url);
    } else if (pool_.ReportUnhealthy(node.url)) {
      PD_LOG_WARN("router: node {} is down (health checks failing)", node.url);
    }
  }
}

}  // namespace pdserve::router
