#include "cli/etcd_flags.h"

#include <memory>
#include <random>

#include <fmt/format.h>

#include "common/logging.h"
#include "http/node_url.h"

namespace pdserve::cli {
namespace {

std::string HostPortOf(const http::NodeAddress& node) {
  return node.host + ":" + std::to_string(node.port);
}

}  // namespace

void AddEtcdFlags(CLI::App* cmd, EtcdFlags* flags) {
  cmd->add_option("--etcd", flags->endpoints,
                  "Cluster membership on etcd: its client URL(s), comma-separated "
                  "(http://HOST:PORT[,...]); none: static flags only");
  cmd->add_option("--etcd-prefix", flags->prefix,
                  "Key prefix of this cluster's members in etcd (several clusters, one etcd)")
      ->capture_default_str();
  cmd->add_option("--etcd-ttl-s", flags->ttl_s,
                  "Lease of this process's registration: silent this long, it leaves the "
                  "membership")
      ->check(CLI::Range(2, 3600))
      ->capture_default_str();
}

Result<http::MembershipOptions> MembershipOptionsFromFlags(const EtcdFlags& flags) {
  http::MembershipOptions options;
  PD_ASSIGN_OR_RETURN(options.endpoints, http::ParseEtcdEndpoints(flags.endpoints));
  if (flags.prefix.empty() || flags.prefix[0] != '/') {
    return Status::InvalidArgument("--etcd-prefix must start with '/': '" + flags.prefix + "'");
  }
  options.prefix = flags.prefix;
  options.ttl_s = flags.ttl_s;
  return options;
}

std::function<void(const std::map<std::string, http::MemberRecord>&)> MakePrefillWatcher(
    server::RoleFront* front, const std::vector<std::string>& static_peers) {
  std::set<std::string> fixed;
  for (const std::string& p : static_peers) {
    if (Result<http::NodeAddress> a = http::ParseNodeUrl(p); a.ok()) fixed.insert(HostPortOf(*a));
  }
  // The prefill members joined so far, by HOST:PORT (the watch thread's alone).
  auto joined = std::make_shared<std::map<std::string, http::NodeAddress>>();
  return [front, fixed, joined](const std::map<std::string, http::MemberRecord>& members) {
    std::map<std::string, http::NodeAddress> now;
    for (const auto& [key, record] : members) {
      if (record.role != "prefill") continue;
      if (Result<http::NodeAddress> a = http::ParseNodeUrl(record.url); a.ok()) {
        now[HostPortOf(*a)] = *a;
      }
    }
    for (auto it = joined->begin(); it != joined->end();) {
      if (now.count(it->first) != 0) {
        ++it;
        continue;
      }
      if (fixed.count(it->first) == 0) {
        if (Status s = front->Leave(it->second); !s.ok()) PD_LOG_DEBUG("{}", s.ToString());
      }
      it = joined->erase(it);
    }
    // A member that restarted at the same address (new incarnation) needs nothing here: its
    // old epoch ends when its heartbeats stop, and the peer is resolved again, as without etcd.
    for (const auto& [name, address] : now) {
      if (!joined->emplace(name, address).second) continue;
      if (Status s = front->Join(address); !s.ok()) {
        PD_LOG_WARN("prefill member {}: {}", name, s.ToString());
      }
    }
  };
}

std::string NewIncarnation() {
  std::random_device rd;
  const uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return fmt::format("{:016x}", v);
}

}  // namespace pdserve::cli
