// A node's role (DESIGN.md §1) and what it adds to the node's HTTP API. NodeServer serves the
// routes every node has; its RoleFront decides how a generation request is submitted, what the
// role adds to /metrics, whether the node is degraded, and the /internal/messenger/ routes.
// Colocated nodes use RoleFront itself; prefill and decode nodes their own fronts
// (server/prefill_front.h, server/decode_front.h), which hold the KV messenger.
//
// Threads: the methods are called on HTTP threads and must be thread-safe. A front is created
// on the owner's thread after the engine and destroyed after the engine's loop stopped, before
// the engine (ServedModel declares it after the engine for that).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/metrics_text.h"
#include "common/status.h"
#include "engine/engine.h"
#include "http/node_url.h"

namespace pdserve::server {

enum class NodeRole : uint8_t { kColocated, kPrefill, kDecode };

// "colocated", "prefill", "decode"; anything else is InvalidArgument.
Result<NodeRole> ParseNodeRole(std::string_view name);
std::string_view NodeRoleName(NodeRole role);

class RoleFront {
 public:
  RoleFront() = default;
  virtual ~RoleFront() = default;
  RoleFront(const RoleFront&) = delete;
  RoleFront& operator=(const RoleFront&) = delete;

  virtual NodeRole role() const { return NodeRole::kColocated; }
  // The generation API (completions, chat); false: 404 (a prefill node).
  virtual bool serves_generation() const { return true; }
  // Submits a validated generation request; `prefill_peer` is the X-Prefill-Peer header ("" if
  // none). Errors are Engine::Submit's (and the decode node's unknown peer).
  virtual Status Submit(Engine& engine, EngineRequest request, const std::string& prefill_peer);
  // What the role adds to /metrics.
  virtual void AppendMetrics(MetricsText& out) const;
  // Why the node serves below its role ("" if it does not): /health "degraded: ...".
  virtual std::string Degraded() const { return ""; }
  // GET /internal/messenger/NAME's body; NotFound for a route the role does not serve.
  virtual Result<std::string> InternalRoute(std::string_view name) const;
  // POST /internal/messenger/join from a prefill node at `node` (its registration body,
  // http/registration_body.h); NotFound unless a decode node.
  virtual Status Join(const http::NodeAddress& node);
  // The prefill node at `node` left the cluster's membership (etcd): a decode node stops using
  // it until it joins again; NotFound unless a decode node that knows it.
  virtual Status Leave(const http::NodeAddress& node);
};

}  // namespace pdserve::server
