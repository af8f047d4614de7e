// Cluster membership on etcd (docs/architecture.md, "Membership"). A process registers itself
// under <prefix>/members/<role>/<host:port> with a lease it keeps alive, its value a JSON
// MemberRecord (role, advertised HTTP and fabric addresses, model and its fingerprint, TP
// layout, incarnation, load); and it watches the members of the roles it needs (a decode node
// the prefill nodes, a router the nodes that serve generation), handing each change of that
// set to a callback. etcd only says where peers are: the cluster secret still decides who is one.
//
// Losing etcd never stops serving: the last membership seen is kept (no callback while etcd is
// away); registration retries until etcd answers, then keeps the old lease if it is still alive
// or registers again with a new one; the watch starts again from the last revision seen (a
// fresh read of the whole prefix if that revision was compacted). Both are logged when they
// change and counted in MembershipMetrics (pdserve:etcd_* on /metrics).
//
// Threads: two of its own (registration, watch); the callback runs on the watch thread. Start
// and the destructor from the owner's thread; the destructor revokes the lease (the process
// leaves the membership at once) and returns within a few seconds even if etcd is away.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/metrics_text.h"
#include "common/mutex.h"
#include "common/status.h"
#include "http/etcd_client.h"

namespace pdserve::http {

struct MemberRecord {
  std::string role;            // "prefill", "decode", "colocated"
  std::string url;             // advertised HTTP address: http://host:port
  std::string fabric_address;  // a prefill node's published transfer-engine address ("" if none)
  std::string model;           // served model name
  std::string fingerprint;     // model identity the messenger's handshake compares ("" colocated)
  int tp_size = 1;             // tensor-parallel ranks
  std::string incarnation;     // new for every process start (hex)
  int running = 0;             // load: requests running
  int waiting = 0;             // load: requests waiting
  std::string ToJson() const;
  static Result<MemberRecord> FromJson(std::string_view text);
};

// Shared between a Membership and the /metrics of its process (which may outlive it).
struct MembershipMetrics {
  std::atomic<bool> enabled{false};
  std::atomic<bool> connected{false};     // the last etcd call of each thread answered
  std::atomic<int64_t> changes{0};        // members joined, left or restarted (watched roles)
  std::atomic<int64_t> registrations{0};  // leases granted and registered under
  std::atomic<int64_t> reconnections{0};  // etcd lost, then answering again
  std::atomic<int64_t> members{0};        // members of the watched roles now
  std::atomic<int64_t> revision{0};       // the last etcd revision seen by the watch
  void Append(MetricsText& out) const;
};

struct MembershipOptions {
  std::vector<std::string> endpoints;  // ParseEtcdEndpoints
  std::string prefix = "/pdserve";     // several clusters may share one etcd
  int ttl_s = 10;                      // lease: a process silent this long leaves the membership
  // Registration: what this process is, asked again at every keep-alive (load); a changed
  // record is written again. Null: not registered (a router).
  std::function<MemberRecord()> self;
  // The roles whose members are watched (empty: no watch).
  std::set<std::string> watch_roles;
  // Every change of the watched members: all of them now, by key. Watch thread.
  std::function<void(const std::map<std::string, MemberRecord>&)> on_change;
  EtcdTimeouts timeouts;
  std::shared_ptr<MembershipMetrics> metrics;  // null: kept to itself
};

// <prefix>/members/ — every member's key starts with it.
std::string MembersPrefix(const std::string& prefix);
// <prefix>/members/<role>/<host:port of url>.
std::string MemberKey(const std::string& prefix, const MemberRecord& record);

class Membership {
 public:
  // Starts the threads; fails only on bad options (etcd need not be up).
  static Result<std::unique_ptr<Membership>> Start(MembershipOptions options);
  ~Membership();
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  const MembershipMetrics& metrics() const { return *options_.metrics; }

 private:
  explicit Membership(MembershipOptions options);
  void RegisterLoop();
  void WatchLoop();
  // Waits `d` or until the destructor; true if it asked to stop.
  bool Sleep(Duration d) EXCLUDES(mu_);
  bool stopping() const EXCLUDES(mu_);
  // A thread's etcd call answered (or did not): logs and counts the changes.
  void SetReachable(int thread, bool ok, const Status& why);

  const MembershipOptions options_;
  EtcdClient client_;
  mutable Mutex mu_;
  CondVar cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  // Per thread (0 registration, 1 watch): -1 not yet known, 0 unreachable, 1 answering.
  std::atomic<int> reachable_[2] = {-1, -1};
  std::atomic<bool> ever_lost_{false};
  std::atomic<int64_t> lease_{0};
  std::thread register_thread_;
  std::thread watch_thread_;
};

}  // namespace pdserve::http
