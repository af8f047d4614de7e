// The router: an OpenAI-compatible HTTP front that holds no model. It forwards each request to
// the healthy node with the fewest outstanding requests, relays streamed (SSE) answers piece by
// piece as they arrive, retries a request on another node while nothing has reached the client
// yet, health-checks its nodes, and accepts node self-registration
// (POST /internal/register {"url": "http://host:port"}, authenticated with the cluster secret).
// Server limits, request ids, the API key, the cluster proof and error shapes come from http/,
// shared with the node; the id the router chooses is the one it forwards.
//
// Thread-safety: Create/Start/Stop from one controlling thread; HTTP handlers run on the
// router's own thread pool; nodes() is thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>

#include "common/clock.h"
#include "common/metrics_text.h"
#include "common/mutex.h"
#include "common/prefix_index.h"
#include "common/status.h"
#include "http/server.h"
#include "router/relay_loop.h"
#include "router/router_nodes.h"
#include "router/router_upstream.h"
#include "router/upstream_connections.h"

namespace pdserve::router {

struct RouterOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                 // 0: any free port (see Router::port())
  std::vector<std::string> nodes;  // node urls known from the start
  std::string api_key;             // empty: no authentication
  // Secret of the cluster: POST /internal/register needs a proof of it (http/cluster_auth.h);
  // empty: registration is refused.
  std::string cluster_key;
  size_t max_body_bytes = 8 << 20;
  size_t max_response_bytes = 64 << 20;  // non-streamed answers are read whole first
  int http_threads = 256;  // each open stream holds one, so this caps concurrent streams
  int max_attempts = 3;    // nodes tried per request before giving up
  Duration health_interval = std::chrono::seconds(1);
  Duration health_timeout = std::chrono::milliseconds(800);
  NodePoolOptions pool;
  // Routing by prefix: a node is preferred by up to this many outstanding requests for holding
  // the prompt's prefix — prefix_weight x (leading blocks of the prompt the router sent it
  // before / the prompt's blocks). 0: least outstanding only.
  double prefix_weight = 2.0;
  // Blocks (64 bytes of prompt text or 16 token ids) the router remembers per node.
  size_t prefix_index_blocks = size_t{1} << 16;
  UpstreamTimeouts upstream;  // `read` also bounds a stream's silence (then an error event)
  // A streamed answer whose client leaves bytes unread this long is ended (the node's
  // connection closed); until then the relay stops reading from that node.
  Duration client_stall = std::chrono::seconds(30);
  UpstreamConnectionOptions upstream_connections;  // idle keep-alive connections to nodes
  // Open client connections beyond which new ones get 503 (see http/server_setup.h).
  size_t max_connections = 8192;
  // Seconds a request head may take to arrive whole (slow clients get 408).
  int header_timeout_s = 10;
  // What else the process adds to /metrics (its etcd membership); any thread.
  std::function<void(MetricsText&)> extra_metrics = {};
};

class Router {
 public:
  // Validates the options (node urls, limits); binds nothing yet.
  static Result<std::unique_ptr<Router>> Create(RouterOptions options);
  ~Router();
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  // Binds host:port and starts serving and health-checking. Returns once the socket listens.
  Status Start();
  // Graceful shutdown, step one: new requests get 503 "shutting_down" and /health 503
  // "draining"; requests in flight go on (streams keep relaying). Idempotent; any thread.
  void BeginDrain();
  // Step two: waits until no request is in flight or `deadline` passes, then ends what is left:
  // an open stream gets an SSE error event and [DONE] (never a cut), a request still waiting
  // for its node 503 "shutting_down"; their node requests are cancelled. Returns once every
  // request has ended (bounded by a few seconds past `deadline`). Calls BeginDrain first.
  void FinishDrain(Deadline deadline);
  // Stops accepting, ends open relays (their node connections close; their clients get an
  // error event and [DONE]) and joins every thread. Idempotent.
  void Stop() EXCLUDES(health_mu_);

  int port() const { return port_; }
  NodePool& nodes() { return pool_; }
  // The nodes the cluster's membership (etcd) lists now: new ones are health-checked at once,
  // the others leave (after their requests in flight). Any thread.
  void SetMembers(const std::vector<std::string>& urls) EXCLUDES(health_mu_);
  UpstreamConnectionStats upstream_connections() const { return connections_.stats(); }

 private:
  explicit Router(RouterOptions options);
  void InstallRoutes();
  void HealthLoop() EXCLUDES(health_mu_);
  void CheckAllNodes();
  // Forgets the prompts thought cached on nodes that left the pool.
  void ForgetRemovedNodes();
  // Ends the health loop's current wait: a new node to check, or Stop.
  void WakeHealthLoop() EXCLUDES(health_mu_);
  // Waits until woken or `deadline`, then clears the wake flag.
  void WaitForHealthTick(TimePoint deadline) EXCLUDES(health_mu_);

  // Handlers.
  void HandleForward(const httplib::Request& req, httplib::Response& res);
  void HandleHealth(httplib::Response& res);
  void HandleMetrics(const httplib::Request& req, httplib::Response& res) EXCLUDES(metrics_mu_);
  void HandleRegister(const httplib::Request& req, httplib::Response& res) EXCLUDES(health_mu_);

  // What a finished request leaves for the log line and the metrics.
  struct Outcome {
    std::string node;  // "-" if none
    int status = 0;
    int attempts = 0;
    size_t bytes = 0;
    // "ok", "failed", "client_gone", "upstream_broken", "upstream_error" (the node's stream
    // ended with an error event), "shutdown" (the router ended it while stopping).
    std::string note;
  };
  void Finish(const std::string& request_id, const httplib::Request& req, TimePoint start,
              const Outcome& outcome) EXCLUDES(metrics_mu_);
  // WaitHead until the read timeout, giving up (Cancelled) once FinishDrain aborts.
  Result<UpstreamHead> WaitHeadOrAbort(UpstreamExchange& exchange);
  // Streams the node's SSE answer to the client, whole events at a time, so that a stream the
  // router must end (node broken, router stopping) ends with a well-formed error event and
  // [DONE]; the handler returns right after.
  void StartRelay(std::shared_ptr<UpstreamExchange> exchange, const UpstreamHead& head,
                  const std::string& request_id, const httplib::Request& req, TimePoint start,
                  int attempts, httplib::Response& res);

  const RouterOptions options_;
  NodePool pool_;
  PrefixIndex prefixes_;  // which prompts went to which node (router.cc's PromptBlocks)
  UpstreamConnections connections_;
  std::unique_ptr<RelayLoop> relay_;  // from Start; streams' bodies go through it
  http::Server server_;
  int port_ = 0;
  std::thread listen_thread_;
  std::thread health_thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> draining_{false};
  std::atomic<bool> abort_in_flight_{false};  // FinishDrain's deadline passed
  std::atomic<int> in_flight_{0};             // forwarded requests not yet finished
  bool started_ = false;

  Mutex health_mu_;
  CondVar health_cv_;
  bool health_wake_ GUARDED_BY(health_mu_) = false;

  // Metrics.
  Mutex metrics_mu_;
  std::map<int, int64_t> responses_by_status_ GUARDED_BY(metrics_mu_);
  std::atomic<int64_t> retries_{0};
  std::atomic<int64_t> no_healthy_node_{0};
  std::atomic<int64_t> client_disconnects_{0};
};

}  // namespace pdserve::router
