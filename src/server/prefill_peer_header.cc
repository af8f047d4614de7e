#include "server/prefill_peer_header.h"

#include <utility>

#include <fmt/format.h>

#include "http/node_url.h"

namespace pdserve::server {

http::ApiResult<std::string> PrefillPeerFromHeaders(const PrefillPeerHeaders& headers) {
  const std::pair<const char*, const std::string*> named[] = {
      {kPrefillPeerHeader, &headers.prefill_peer},
      {kPrefillerHostPortHeader, &headers.prefiller_host_port},
      {kPrefillerUrlHeader, &headers.prefiller_url}};
  std::string peer;
  const char* from = nullptr;
  for (const auto& [header, value] : named) {
    if (value->empty()) continue;
    // http://HOST:PORT and HOST:PORT alike; a path, https or a missing port is refused.
    Result<http::NodeAddress> address = http::ParseNodeUrl(*value);
    if (!address.ok()) {
      return http::ApiError::InvalidRequest(
          fmt::format("header {}: {}", header, address.status().message()), header);
    }
    std::string name = address->host + ":" + std::to_string(address->port);
    if (from != nullptr && name != peer) {
      return http::ApiError::InvalidRequest(
          fmt::format("header {} names prefill node {} but {} names {}", from, peer, header, name),
          header);
    }
    peer = std::move(name);
    from = header;
  }
  return peer;
}

}  // namespace pdserve::server
