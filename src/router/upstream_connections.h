// The router's idle keep-alive connections to its nodes, kept per node url, so that a request
// reuses one rather than opening a TCP connection each time (a connect, and the node's accept
// and hand-over to its poller, before the request can even be read).
//
// A connection comes back here only after its response ended whole with nothing unread and
// the node did not say "Connection: close" (router/router_upstream.h decides); a stream whose
// client leaves closes its own connection, which the node takes for its client leaving, and
// never touches the idle ones. An idle connection is closed, rather than handed out, once it
// passed its expiry (kept below the node's keep-alive timeout, so the node does not close it
// as a request goes out) or once it turned readable while idle (the node closed it or sent
// something unasked). Thread-safe: every method may be called from any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"

namespace pdserve::router {

struct UpstreamConnectionOptions {
  size_t max_idle_per_node = 64;  // beyond this a connection given back is closed
  // Longest an idle connection is kept; shortened to a second (at most half) below the node's
  // keep-alive timeout when the node announces one ("Keep-Alive: timeout=N").
  Duration idle_timeout = std::chrono::seconds(3);
};

// Counters for /metrics.
struct UpstreamConnectionStats {
  int64_t opened = 0;  // new connections to nodes
  int64_t reused = 0;  // requests sent on an idle connection
  size_t idle = 0;     // idle connections held now
};

class UpstreamConnections {
 public:
  explicit UpstreamConnections(UpstreamConnectionOptions options = {});
  ~UpstreamConnections();  // closes every idle connection
  UpstreamConnections(const UpstreamConnections&) = delete;
  UpstreamConnections& operator=(const UpstreamConnections&) = delete;

  // An idle connection to `url` that is still open (the caller owns it from now on), or -1.
  int Take(const std::string& url);
  // Gives back a connection whose last response ended whole; `node_timeout`: the node's
  // keep-alive timeout, if it said one (zero: not said). Closed at once if the node has
  // max_idle_per_node idle connections already.
  void Put(const std::string& url, int fd, Duration node_timeout = Duration::zero());
  // Closes idle connections that expired or that the node closed (the health loop's tick).
  void CloseStale();

  // A new connection was opened for a request (counted for stats()).
  void CountOpened() { opened_.fetch_add(1, std::memory_order_relaxed); }
  UpstreamConnectionStats stats() const;

 private:
  struct Idle {
    int fd;
    TimePoint expires;
  };

  const UpstreamConnectionOptions options_;
  std::atomic<int64_t> opened_{0};
  std::atomic<int64_t> reused_{0};
  mutable Mutex mu_;
  // Per node url, the most recently returned last (taken first: least likely to have expired).
  std::unordered_map<std::string, std::vector<Idle>> idle_ GUARDED_BY(mu_);
};

}  // namespace pdserve::router
