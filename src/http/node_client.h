// The one HTTP client the processes of a cluster use to call each other (and themselves) for
// small exchanges: a router's health checks, a node's registration and joins, a decode node
// asking a prefill node where its transfer engine is, `up` and the soak polling /health and
// /metrics. One request per call, on a connection of its own, within the call's timeouts;
// nodes are named by their NodeAddress (http/node_url.h). Streams and the router's relay use
// other paths (router/router_upstream.h). Safe from any thread.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "common/clock.h"
#include "common/status.h"
#include "http/node_url.h"

namespace pdserve::http {

struct NodeCallOptions {
  Duration connect_timeout = std::chrono::seconds(1);
  Duration timeout = std::chrono::seconds(2);  // for the request to go out and the answer to come
  // Non-empty: the request carries a proof of this cluster secret, as /internal/ routes
  // require (http/cluster_auth.h).
  std::string cluster_key;
};

// The node's answer, whatever its status.
struct NodeReply {
  int status = 0;
  std::string body;
};

// GET `path` (with its query, if any) from `node`. Unavailable (naming the node and the
// path) if no answer came: unreachable, timed out, or cut off.
Result<NodeReply> NodeGet(const NodeAddress& node, std::string_view path,
                          const NodeCallOptions& options = {});
// POST `body` (application/json) to `path` on `node`; errors as NodeGet.
Result<NodeReply> NodePost(const NodeAddress& node, std::string_view path, std::string_view body,
                           const NodeCallOptions& options = {});
// NodeGet's body if the node answered 200; otherwise Unavailable with the status and the
// start of the body.
Result<std::string> NodeGetOk(const NodeAddress& node, std::string_view path,
                              const NodeCallOptions& options = {});

// This machine's process listening on `port`: http://127.0.0.1:port.
NodeAddress LocalNode(int port);

}  // namespace pdserve::http
