// A node's HTTP address as the cluster names it: "http://host:port" (or "host:port"), the form
// routers, registrations, joins and prefill-peer flags use. Pure functions; any thread.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace pdserve::http {

// `url` is the normalized form "http://host:port" used as a node's key.
struct NodeAddress {
  std::string host;
  int port = 0;
  std::string url;
};

// Accepts "http://host:port", "host:port" (and a trailing '/'); https and paths are refused.
Result<NodeAddress> ParseNodeUrl(std::string_view text);

}  // namespace pdserve::http
