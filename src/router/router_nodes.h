// The router's table of nodes: addresses, health and outstanding requests, and the choice of
// the node for the next request (least outstanding among healthy nodes, those not degraded
// first, ties round robin).
// Pure bookkeeping, no I/O: the router's health checker and request handlers report what they
// saw. NodePool is thread-safe; every method may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/status.h"
#include "http/node_url.h"

namespace pdserve::router {

using http::NodeAddress;
using http::ParseNodeUrl;

struct NodePoolOptions {
  // Consecutive failed health checks after which a node gets no traffic.
  int failures_to_down = 3;
  // A self-registered node that has not refreshed its registration for this long is dropped.
  Duration registration_ttl = std::chrono::seconds(30);
};

// What /metrics and /health show of one node.
struct NodeSnapshot {
  std::string url;
  bool healthy = false;
  // Why a healthy node serves below its role ("" if it does not), from its /health answer
  // ("degraded: <why>"; e.g. a decode node with no usable prefill peer).
  std::string degraded;
  bool registered = false;  // added by POST /internal/register rather than --node
  bool member = false;      // listed by the cluster's membership (etcd)
  int outstanding = 0;
  int64_t requests = 0;  // requests sent to it
  int consecutive_failures = 0;
};

class NodePool {
 public:
  explicit NodePool(NodePoolOptions options = {});
  NodePool(const NodePool&) = delete;
  NodePool& operator=(const NodePool&) = delete;

  // A node from the command line; it never expires. New nodes start unhealthy until their first
  // successful health check, so no request is sent to a node still loading its model.
  Status AddStatic(std::string_view url) EXCLUDES(mu_);
  // Adds a self-registered node or refreshes its registration. Returns true if it was new.
  Result<bool> Register(std::string_view url, TimePoint now = Clock::now()) EXCLUDES(mu_);
  // The nodes the cluster's membership (etcd) lists now, replacing the last list: new ones are
  // added (unhealthy until checked), those no longer listed leave unless --node or a live
  // registration keeps them — at once without a request in flight, else they get no new
  // request and leave when the last one ends. True if a node was added. Bad urls are skipped.
  bool SetMembers(const std::vector<std::string>& urls) EXCLUDES(mu_);
  // Drops self-registered nodes whose registration expired and that carry no request, and
  // nodes that left the membership once their last request ended.
  void ExpireRegistrations(TimePoint now = Clock::now()) EXCLUDES(mu_);
  // The urls of the nodes dropped from the pool since the last call, in order (the router then
  // forgets what it guessed of their caches).
  std::vector<std::string> TakeRemoved() EXCLUDES(mu_);

  // Picks the healthy node with the lowest cost — its outstanding requests less `bonus(url)`
  // (the router's prefix preference; none if empty) — skipping the urls in `exclude` (nodes
  // already tried for this request), and counts one more request on it. A degraded node is
  // picked only when no healthy node that is not degraded is left. `bonus` runs under the
  // pool's lock: it must not call back into the pool. Every successful Acquire is paired with
  // one Release.
  std::optional<NodeAddress> Acquire(const std::vector<std::string>& exclude = {},
                                     const std::function<double(const std::string&)>& bonus = {})
      EXCLUDES(mu_);
  void Release(const std::string& url) EXCLUDES(mu_);

  // Health check results. A success makes the node healthy at once; failures_to_down
  // consecutive failures make it unhealthy.
  // `degraded`: why the node says it is degraded ("" if it does not). Both return true when
  // the node's health (or degraded state) changed (for the log).
  bool ReportHealthy(const std::string& url, const std::string& degraded = "") EXCLUDES(mu_);
  bool ReportUnhealthy(const std::string& url) EXCLUDES(mu_);
  // A request could not even connect: the node is marked down without waiting for the
  // health checker (it comes back with the next successful check).
  void ReportConnectFailure(const std::string& url) EXCLUDES(mu_);

  std::vector<NodeAddress> Addresses() const EXCLUDES(mu_);
  std::vector<NodeSnapshot> Snapshot() const EXCLUDES(mu_);
  int HealthyCount() const EXCLUDES(mu_);
  int DegradedCount() const EXCLUDES(mu_);  // healthy nodes that say they are degraded
  int Size() const EXCLUDES(mu_);

 private:
  struct Node {
    NodeAddress address;
    bool healthy = false;
    std::string degraded;
    bool registered = false;
    bool is_static = false;  // --node
    bool member = false;     // listed by the membership
    bool withdrawn = false;  // left the membership with requests in flight: no new ones
    TimePoint last_registration;
    int outstanding = 0;
    int64_t requests = 0;
    int consecutive_failures = 0;
  };
  Node* FindLocked(const std::string& url) REQUIRES(mu_);

  const NodePoolOptions options_;
  mutable Mutex mu_;
  std::vector<Node> nodes_ GUARDED_BY(mu_);           // order of addition
  std::vector<std::string> removed_ GUARDED_BY(mu_);  // dropped since the last TakeRemoved
  size_t next_ GUARDED_BY(mu_) = 0;                   // round-robin start among ties
};

}  // namespace pdserve::router
