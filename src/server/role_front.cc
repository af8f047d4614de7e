#include "server/role_front.h"

namespace pdserve::server {

Result<NodeRole> ParseNodeRole(std::string_view name) {
  for (NodeRole role : {NodeRole::kColocated, NodeRole::kPrefill, NodeRole::kDecode}) {
    if (name == NodeRoleName(role)) return role;
  }
  return Status::InvalidArgument("unknown node role '" + std::string(name) +
                                 "' (colocated, prefill or decode)");
}

std::string_view NodeRoleName(NodeRole role) {
  switch (role) {
    case NodeRole::kColocated:
      return "colocated";
    case NodeRole::kPrefill:
      return "prefill";
    case NodeRole::kDecode:
      return "decode";
  }
  return "?";
}

Status RoleFront::Submit(Engine& engine, EngineRequest request, const std::string&) {
  return engine.Submit(std::move(request));
}

void RoleFront::AppendMetrics(MetricsText&) const {}

Result<std::string> RoleFront::InternalRoute(std::string_view name) const {
  return Status::NotFound("no route " + std::string(name));
}

Status RoleFront::Join(const http::NodeAddress&) {
  return Status::NotFound("only a decode node takes joins");
}

Status RoleFront::Leave(const http::NodeAddress&) {
  return Status::NotFound("only a decode node has prefill peers");
}

}  // namespace pdserve::server
