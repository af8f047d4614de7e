// NodeServer: the OpenAI-compatible HTTP front of one colocated node — /v1/completions,
// /v1/chat/completions (stream and not), /v1/models, /health, /ready, /metrics, /tokenize and
// /detokenize — over one Engine running on its own loop thread.
//
// Threading: Bind/Start/SetModel/Stop are called by the owner (serve's main thread); Stop is
// also safe from any thread. HTTP handlers run on cpp-httplib's pool; each one tokenizes,
// validates, submits, then drains its request's outputs through one RequestDrain
// (server/request_drain.h) whether it streams or answers whole, always with a deadline.
// Server limits, request ids, the API key and error shapes come from http/server_setup.h,
// shared with the router.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "common/clock.h"
#include "common/status.h"
#include "engine/engine.h"
#include "server/metrics.h"
#include "server/role_front.h"
#include "tokenizer/tokenizer.h"

namespace pdserve::http {
class Server;
}

namespace pdserve::server {

struct NodeServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                // 0: any free port (read it back with port())
  std::string api_key;            // non-empty: "Authorization: Bearer <key>" required
  std::string cluster_key;        // GET /internal/... needs a proof of it; empty: 403
  std::string served_model_name;  // the name /v1/models lists and requests must use
  int max_waiting = 256;          // more requests than this awaiting a first token -> 503
  size_t max_body_bytes = size_t{4} << 20;
  int http_threads = 160;       // each streaming client holds one for its duration
  int request_timeout_s = 600;  // a request with no output for this long is cancelled
  // Open HTTP connections beyond which new ones get 503 (see http/server_setup.h).
  size_t max_connections = 4096;
  // Seconds a request head may take to arrive whole (slow clients get 408).
  int header_timeout_s = 10;
  // What else the process adds to /metrics (its etcd membership); any thread.
  std::function<void(MetricsText&)> extra_metrics = {};
};

// What the node serves, handed over once loaded.
struct ServedModel {
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<Engine> engine;  // the server starts its loop thread
  int max_model_len = 0;
  // What the node's role adds (server/role_front.h): how generation requests are submitted,
  // /metrics, /health's "degraded: <why>" (200; /ready 503), /internal/messenger/ routes, joins.
  // Null: colocated. After `engine`, so destroyed before it (after the engine loop stopped).
  std::unique_ptr<RoleFront> role;
};

class NodeServer {
 public:
  explicit NodeServer(NodeServerOptions options);
  ~NodeServer();  // Stop()
  NodeServer(const NodeServer&) = delete;
  NodeServer& operator=(const NodeServer&) = delete;

  // Binds host:port; errors name the address.
  Status Bind();
  int port() const { return bound_port_; }
  // Serves on a background thread; until SetModel, /health answers 503 and the API 503.
  void Start();
  Status SetModel(ServedModel model);
  // Graceful shutdown before Stop: new requests get 503 "shutting_down" and /health 503
  // "draining"; running requests may finish for up to `grace`; then the rest are cancelled and
  // end as clients can read it (a stream with an SSE error event and [DONE], a whole answer
  // with 503 "cancelled"). Returns once every request has ended (bounded by a few seconds past
  // `grace`). Owner's thread.
  void Drain(Duration grace);
  // Stops accepting, cancels in-flight requests, waits for handlers. Without Drain first, open
  // streams are cut. Idempotent.
  void Stop();

  // Handler bodies (public for the request-scoped helpers in node_server.cc).
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<http::Server> http_;
  std::thread listen_thread_;
  int bound_port_ = 0;
  std::atomic<bool> stopped_{false};
};

}  // namespace pdserve::server
