// EtcdClient: the few calls of etcd's v3 API that cluster membership needs, over etcd's JSON
// gateway (HTTP/1.1 POSTs to /v3/...; keys and values base64 in the JSON bodies, 64-bit
// integers as strings; as served by etcd 3.4, Debian's etcd-server). Leases (grant, keep-alive,
// revoke), put, range over a prefix, delete, and a watch stream read until it ends or is
// stopped. Several endpoints (an etcd cluster's members) may be given: a call that cannot
// connect to one tries the next, and the client stays on the one that answered.
//
// Threads: every call may be made from any thread; Watch blocks its caller, and StopWatch (any
// thread) ends every Watch in progress promptly.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/status.h"

namespace httplib {
class Client;
}

namespace pdserve::http {

std::string Base64Encode(std::string_view bytes);
// InvalidArgument on a character outside the standard alphabet or a bad length.
Result<std::string> Base64Decode(std::string_view text);
// The end of the range of every key that starts with `prefix` (etcd's range_end: the prefix
// with its last byte incremented).
std::string PrefixRangeEnd(std::string_view prefix);
// "http://h:p,h:p" or "h:p" (comma-separated) -> normalised "http://h:p" each; InvalidArgument
// for an empty list, https or a path.
Result<std::vector<std::string>> ParseEtcdEndpoints(std::string_view list);

struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t mod_revision = 0;
  int64_t lease = 0;
};

struct EtcdRange {
  int64_t revision = 0;  // the store's revision the range was read at
  std::vector<EtcdKeyValue> kvs;
};

struct EtcdEvent {
  bool deleted = false;  // DELETE (a lease that ended deletes its keys); else PUT
  EtcdKeyValue kv;
};

// One message of a watch stream.
struct EtcdWatchResponse {
  int64_t header_revision = 0;
  bool created = false;
  bool canceled = false;
  // Non-zero: the start revision was compacted away; watch again from a fresh range.
  int64_t compact_revision = 0;
  std::string cancel_reason;
  std::vector<EtcdEvent> events;
};

// Parses one message of the gateway's watch stream ({"result": {...}} or {"error": {...}}).
Result<EtcdWatchResponse> ParseWatchResponse(const nlohmann::json& message);

struct EtcdTimeouts {
  Duration connect = std::chrono::seconds(1);
  Duration call = std::chrono::seconds(2);  // a unary call's whole answer
  // A watch stream silent this long ends (DeadlineExceeded) so that a cut link is noticed;
  // the caller watches again from the revision it reached.
  Duration watch_idle = std::chrono::seconds(10);
};

class EtcdClient {
 public:
  explicit EtcdClient(std::vector<std::string> endpoints, EtcdTimeouts timeouts = {});
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // A lease of `ttl_s` seconds; its id.
  Result<int64_t> GrantLease(int ttl_s);
  // One keep-alive: the lease's TTL again; NotFound if it has expired (its keys are gone).
  Result<int64_t> KeepAlive(int64_t lease);
  Status Revoke(int64_t lease);  // deletes the lease's keys at once
  Status Put(std::string_view key, std::string_view value, int64_t lease = 0);
  Result<EtcdRange> RangePrefix(std::string_view prefix);
  Status Delete(std::string_view key);
  // Watches every key under `prefix` from `start_revision`, handing each stream message to
  // `on_response` until it returns false (Ok), the stream ends or breaks (Unavailable), the
  // stream is silent for watch_idle (DeadlineExceeded), or StopWatch (Cancelled).
  Status Watch(std::string_view prefix, int64_t start_revision,
               const std::function<bool(const EtcdWatchResponse&)>& on_response) EXCLUDES(mu_);
  // Ends every Watch in progress and every later one at once (Cancelled). Any thread.
  void StopWatch() EXCLUDES(mu_);

  std::string endpoint() const EXCLUDES(mu_);  // the one in use

 private:
  // POSTs `body` to `path`, trying each endpoint once from the current one.
  Result<nlohmann::json> Call(std::string_view path, const nlohmann::json& body) EXCLUDES(mu_);

  const std::vector<std::string> endpoints_;
  const EtcdTimeouts timeouts_;
  mutable Mutex mu_;
  size_t current_ GUARDED_BY(mu_) = 0;
  bool stopped_ GUARDED_BY(mu_) = false;
  std::set<httplib::Client*> watching_ GUARDED_BY(mu_);
};

}  // namespace pdserve::http
