// One HTTP exchange between the router and a node, run on its own thread so that the client's
// handler can relay the node's response while it is still arriving. The node thread pushes the
// response head and each body piece into a bounded queue as soon as they arrive; the handler
// pops them. Cancel() closes the node connection (the node then cancels its request).
// Thread-safe: Start on any thread; WaitHead/Pop from one consumer thread; Cancel from any.
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <httplib.h>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/status.h"
#include "router/router_nodes.h"

namespace pdserve::router {

struct UpstreamRequest {
  std::string method;  // "GET" or "POST"
  std::string path;
  httplib::Headers headers;
  std::string body;
};

struct UpstreamTimeouts {
  Duration connect = std::chrono::seconds(2);
  Duration read = std::chrono::seconds(600);  // longest silence from the node
  Duration write = std::chrono::seconds(30);
  size_t max_buffered_bytes = 1 << 20;  // back-pressure when the client reads slowly
};

struct UpstreamHead {
  int status = 0;
  httplib::Headers headers;
};

class UpstreamExchange {
 public:
  // Starts the exchange on a new thread.
  static std::shared_ptr<UpstreamExchange> Start(NodeAddress node, UpstreamRequest request,
                                                 UpstreamTimeouts timeouts);
  ~UpstreamExchange();  // cancels if still running, then joins the thread
  UpstreamExchange(const UpstreamExchange&) = delete;
  UpstreamExchange& operator=(const UpstreamExchange&) = delete;

  // The response head. Unavailable if the node could not be reached or failed before sending
  // a head (the request never started there, so it may be retried elsewhere);
  // DeadlineExceeded past `deadline`.
  Result<UpstreamHead> WaitHead(Deadline deadline) EXCLUDES(mu_);

  enum class Next { kData, kEnd, kTimeout, kError };
  // The next body piece into *data (kData), the end of the body (kEnd), nothing before
  // `deadline` (kTimeout), or a broken exchange (kError, message in *data).
  Next Pop(std::string* data, Deadline deadline) EXCLUDES(mu_);

  // The whole remaining body, for non-streamed responses. Errors if the exchange breaks or
  // the body exceeds `limit`; Cancelled (and the exchange cancelled) once `*abort` is set
  // (checked a few times a second; null: never).
  Result<std::string> ReadAll(Deadline deadline, size_t limit,
                              const std::atomic<bool>* abort = nullptr) EXCLUDES(mu_);

  void Cancel() EXCLUDES(mu_);
  bool connect_failed() const EXCLUDES(mu_);
  const NodeAddress& node() const { return node_; }

 private:
  UpstreamExchange(NodeAddress node, UpstreamTimeouts timeouts);
  void Run(UpstreamRequest request);
  bool OnHead(const httplib::Response& response) EXCLUDES(mu_);
  bool OnData(const char* data, size_t size) EXCLUDES(mu_);
  void Finish(httplib::Error error, const httplib::Response& response) EXCLUDES(mu_);

  const NodeAddress node_;
  const UpstreamTimeouts timeouts_;
  httplib::Client client_;  // stop() is the one call made from other threads
  std::thread thread_;

  mutable Mutex mu_;
  CondVar cv_;
  std::optional<UpstreamHead> head_ GUARDED_BY(mu_);
  std::deque<std::string> pieces_ GUARDED_BY(mu_);
  size_t buffered_ GUARDED_BY(mu_) = 0;
  bool done_ GUARDED_BY(mu_) = false;
  bool cancelled_ GUARDED_BY(mu_) = false;
  bool connect_failed_ GUARDED_BY(mu_) = false;
  std::string error_ GUARDED_BY(mu_);  // set if the exchange broke
};

}  // namespace pdserve::router
