#include "http/etcd_membership.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "common/logging.h"
#include "http/node_url.h"

namespace pdserve::http {
namespace {

constexpr int kRegisterThread = 0;
constexpr int kWatchThread = 1;
// Between attempts while etcd does not answer.
constexpr auto kEtcdRetry = std::chrono::milliseconds(1000);

}  // namespace

std::string MemberRecord::ToJson() const {
  return nlohmann::json{{"role", role},
                        {"url", url},
                        {"fabric_address", fabric_address},
                        {"model", model},
                        {"fingerprint", fingerprint},
                        {"tp_size", tp_size},
                        {"incarnation", incarnation},
                        {"load", {{"running", running}, {"waiting", waiting}}}}
      .dump();
}

Result<MemberRecord> MemberRecord::FromJson(std::string_view text) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    MemberRecord r;
    r.role = j.at("role").get<std::string>();
    r.url = j.at("url").get<std::string>();
    r.fabric_address = j.value("fabric_address", "");
    r.model = j.value("model", "");
    r.fingerprint = j.value("fingerprint", "");
    r.tp_size = j.value("tp_size", 1);
    r.incarnation = j.value("incarnation", "");
    if (j.contains("load") && j["load"].is_object()) {
      r.running = j["load"].value("running", 0);
      r.waiting = j["load"].value("waiting", 0);
    }
    PD_ASSIGN_OR_RETURN(NodeAddress address, ParseNodeUrl(r.url));
    r.url = address.url;
    return r;
  } catch (const nlohmann::json::exception& e) {
    return Status::InvalidArgument(std::string("member record: ") + e.what());
  }
}

void MembershipMetrics::Append(MetricsText& out) const {
  if (!enabled.load()) return;
  out.Gauge("pdserve:etcd_connected",
            "1 while etcd answers this process's registration and watch; 0 while it serves on "
            "the last membership seen.",
            connected.load() ? 1 : 0)
      .Counter("pdserve:membership_changes_total",
               "Watched members that joined, left or restarted (new incarnation).",
               static_cast<double>(changes.load()))
      .Gauge("pdserve:membership_members", "Members of the watched roles now.",
             static_cast<double>(members.load()))
      .Counter("pdserve:etcd_registrations_total",
               "Leases this process registered under (1 unless a lease expired).",
               static_cast<double>(registrations.load()))
      .Counter("pdserve:etcd_reconnections_total", "Times etcd answered again after being lost.",
               static_cast<double>(reconnections.load()))
      .Gauge("pdserve:etcd_watch_revision", "The last etcd revision the watch saw.",
             static_cast<double>(revision.load()));
}

std::string MembersPrefix(const std::string& prefix) {
  std::string p = prefix;
  while (!p.empty() && p.back() == '/') p.pop_back();
  return p + "/members/";
}

std::string MemberKey(const std::string& prefix, const MemberRecord& record) {
  std::string host_port = record.url;
  if (host_port.rfind("http://", 0) == 0) host_port = host_port.substr(7);
  return MembersPrefix(prefix) + record.role + "/" + host_port;
}

Result<std::unique_ptr<Membership>> Membership::Start(MembershipOptions options) {
  if (options.endpoints.empty()) return Status::InvalidArgument("membership needs --etcd");
  if (options.ttl_s < 2) return Status::InvalidArgument("--etcd-ttl-s must be at least 2");
  if (options.prefix.empty() || options.prefix[0] != '/') {
    return Status::InvalidArgument("--etcd-prefix must start with '/': '" + options.prefix + "'");
  }
  if (!options.metrics) options.metrics = std::make_shared<MembershipMetrics>();
  options.metrics->enabled = true;
  std::unique_ptr<Membership> m(new Membership(std::move(options)));
  if (m->options_.self) m->register_thread_ = std::thread([p = m.get()] { p->RegisterLoop(); });
  if (!m->options_.watch_roles.empty()) {
    m->watch_thread_ = std::thread([p = m.get()] { p->WatchLoop(); });
  }
  return m;
}

Membership::Membership(MembershipOptions options)
    : options_(std::move(options)), client_(options_.endpoints, options_.timeouts) {
  // A thread not in use counts as answering, so `connected` is that of the ones in use.
  if (!options_.self) reachable_[kRegisterThread] = 1;
  if (options_.watch_roles.empty()) reachable_[kWatchThread] = 1;
}

Membership::~Membership() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  client_.StopWatch();
  if (register_thread_.joinable()) register_thread_.join();
  if (watch_thread_.joinable()) watch_thread_.join();
  // Leave at once rather than when the lease runs out (a drained node takes no new requests).
  if (const int64_t lease = lease_.load(); lease != 0) {
    if (Status s = client_.Revoke(lease); s.ok()) {
      PD_LOG_INFO("etcd: left the membership (lease {:x} revoked)", lease);
    } else {
      PD_LOG_WARN("etcd: could not revoke lease {:x} ({}); it ends in {} s", lease, s.message(),
                  options_.ttl_s);
    }
  }
  options_.metrics->connected = false;
}

bool Membership::stopping() const {
  MutexLock lock(&mu_);
  return stop_;
}

bool Membership::Sleep(Duration d) {
  const TimePoint until = Clock::now() + d;
  MutexLock lock(&mu_);
  while (!stop_) {
    if (cv_.WaitUntil(&mu_, until) == std::cv_status::timeout) break;
  }
  return stop_;
}

void Membership::SetReachable(int thread, bool ok, const Status& why) {
  const int now = ok ? 1 : 0;
  const int before = reachable_[thread].exchange(now);
  if (before == now) return;
  const char* what = thread == kRegisterThread ? "registration" : "watch";
  if (!ok) {
    PD_LOG_WARN("etcd {} at {}: {}; serving with the last membership seen, retrying every {} ms",
                what, client_.endpoint(), why.message(), kEtcdRetry.count());
  } else if (before == 0) {
    PD_LOG_INFO("etcd {}: {} answers again", what, client_.endpoint());
  }
  const bool connected = reachable_[kRegisterThread] == 1 && reachable_[kWatchThread] == 1;
  const bool was = options_.metrics->connected.exchange(connected);
  if (!was && connected) {
    if (ever_lost_.load()) ++options_.metrics->reconnections;
  } else if (was && !connected) {
    ever_lost_ = true;
  }
}

void Membership::RegisterLoop() {
  const Duration refresh =
      std::max<Duration>(std::chrono::milliseconds(500), std::chrono::seconds(options_.ttl_s) / 3);
  std::string last_value;
  int64_t lease = 0;
  while (!stopping()) {
    const MemberRecord self = options_.self();
    const std::string key = MemberKey(options_.prefix, self);
    const std::string value = self.ToJson();
    Status s;
    if (lease == 0) {
      Result<int64_t> granted = client_.GrantLease(options_.ttl_s);
      s = granted.status();
      if (s.ok()) s = client_.Put(key, value, *granted);
      if (s.ok()) {
        lease = *granted;
        lease_ = lease;
        last_value = value;
        ++options_.metrics->registrations;
        PD_LOG_INFO("etcd: registered {} as {} (lease {:x}, {} s) at {}", self.url, key, lease,
                    options_.ttl_s, client_.endpoint());
      }
    } else {
      Result<int64_t> ttl = client_.KeepAlive(lease);
      if (!ttl.ok() && ttl.status().code() == StatusCode::kNotFound) {
        // etcd was away longer than the lease (or forgot it): the key is gone; register anew.
        PD_LOG_WARN("etcd: lease {:x} of {} expired; registering again", lease, key);
        lease = 0;
        lease_ = 0;
        SetReachable(kRegisterThread, true, Status::Ok());
        continue;
      }
      s = ttl.status();
      if (s.ok() && value != last_value) {
        s = client_.Put(key, value, lease);
        if (s.ok()) last_value = value;
      }
    }
    SetReachable(kRegisterThread, s.ok(), s);
    Sleep(s.ok() ? refresh : std::min<Duration>(refresh, kEtcdRetry));
  }
}

void Membership::WatchLoop() {
  const std::string prefix = MembersPrefix(options_.prefix);
  std::map<std::string, MemberRecord> members;    // of the watched roles, by key
  std::map<std::string, MemberRecord> published;  // what on_change last saw
  bool ever_published = false;
  int64_t revision = 0;
  bool need_range = true;
  // Hands a changed set to the callback, logging who joined, left or restarted.
  auto publish = [&] {
    int64_t changes = 0;
    for (const auto& [key, record] : members) {
      auto it = published.find(key);
      if (it == published.end()) {
        ++changes;
        PD_LOG_INFO("etcd: member {} joined ({} {}, incarnation {})", key, record.role, record.url,
                    record.incarnation);
      } else if (it->second.incarnation != record.incarnation) {
        ++changes;
        PD_LOG_INFO("etcd: member {} restarted (incarnation {} -> {})", key, it->second.incarnation,
                    record.incarnation);
      }
    }
    for (const auto& [key, record] : published) {
      if (members.count(key) == 0) {
        ++changes;
        PD_LOG_INFO("etcd: member {} left ({})", key, record.url);
      }
    }
    options_.metrics->changes += changes;
    options_.metrics->members = static_cast<int64_t>(members.size());
    const bool any_difference =
        !ever_published || members.size() != published.size() ||
        !std::equal(members.begin(), members.end(), published.begin(),
                    [](const auto& a, const auto& b) {
                      return a.first == b.first && a.second.ToJson() == b.second.ToJson();
                    });
    if (!any_difference) return;
    published = members;
    ever_published = true;
    if (options_.on_change) options_.on_change(members);
  };
  auto apply = [&](const std::string& key, const std::string& value) {
    Result<MemberRecord> record = MemberRecord::FromJson(value);
    if (!record.ok()) {
      PD_LOG_WARN("etcd: {} is not a member record ({}); ignored", key, record.status().message());
      members.erase(key);
      return;
    }
    if (options_.watch_roles.count(record->role) == 0) return;
    members[key] = std::move(record).value();
  };
  while (!stopping()) {
    if (need_range) {
      Result<EtcdRange> range = client_.RangePrefix(prefix);
      if (!range.ok()) {
        SetReachable(kWatchThread, false, range.status());
        Sleep(kEtcdRetry);
        continue;
      }
      SetReachable(kWatchThread, true, Status::Ok());
      members.clear();
      for (const EtcdKeyValue& kv : range->kvs) apply(kv.key, kv.value);
      revision = range->revision;
      options_.metrics->revision = revision;
      need_range = false;
      publish();
    }
    const Status s = client_.Watch(prefix, revision + 1, [&](const EtcdWatchResponse& r) {
      SetReachable(kWatchThread, true, Status::Ok());
      if (r.compact_revision > 0 || r.canceled) {
        PD_LOG_WARN("etcd: watch from revision {} cancelled ({}{}); reading the members again",
                    revision + 1, r.cancel_reason, r.compact_revision > 0 ? ", compacted" : "");
        need_range = true;
        return false;
      }
      // Only events (and progress notices, which carry none) move the revision: the header of
      // the "created" answer is ahead of the history still to come.
      if (r.events.empty() && !r.created) revision = std::max(revision, r.header_revision);
      for (const EtcdEvent& e : r.events) {
        revision = std::max(revision, e.kv.mod_revision);
        if (e.deleted) {
          members.erase(e.kv.key);
        } else {
          apply(e.kv.key, e.kv.value);
        }
      }
      options_.metrics->revision = revision;
      if (!r.events.empty()) publish();
      return !stopping();
    });
    if (stopping()) break;
    if (s.ok() || s.code() == StatusCode::kDeadlineExceeded) continue;  // watch again
    SetReachable(kWatchThread, false, s);
    Sleep(kEtcdRetry);
  }
}

}  // namespace pdserve::http
