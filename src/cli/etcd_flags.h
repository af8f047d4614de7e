// The membership flags `pdserve serve` and `pdserve router` share (--etcd, --etcd-prefix,
// --etcd-ttl-s; docs/api.md, docs/architecture.md "Membership"), and what a decode node does
// with the prefill nodes the membership lists. Used from main() only, except the callback
// MakePrefillWatcher returns (the membership's watch thread).
#pragma once

#include <functional>
#include <map>
#include <set>
#include <string>

#include <CLI/CLI.hpp>

#include "common/status.h"
#include "http/etcd_membership.h"
#include "server/role_front.h"

namespace pdserve::cli {

struct EtcdFlags {
  std::string endpoints;  // "" : no membership
  std::string prefix = "/pdserve";
  int ttl_s = 10;
};

void AddEtcdFlags(CLI::App* cmd, EtcdFlags* flags);

// Options with the flags' endpoints, prefix and lease (the caller adds self, roles, callback).
Result<http::MembershipOptions> MembershipOptionsFromFlags(const EtcdFlags& flags);

// A decode node's callback for the prefill members: each new one is joined (handshaken), each
// one gone leaves (RoleFront::Leave). Peers given by --prefill-peer (`static_peers`, HOST:PORT
// or URLs) never leave.
std::function<void(const std::map<std::string, http::MemberRecord>&)> MakePrefillWatcher(
    server::RoleFront* front, const std::vector<std::string>& static_peers);

// A fresh incarnation for this process's registration (random, hex).
std::string NewIncarnation();

}  // namespace pdserve::cli
