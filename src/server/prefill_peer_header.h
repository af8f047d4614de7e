// Which prefill node a request asks for, from its headers: pdserve's own X-Prefill-Peer, or what
// llm-d's inference scheduler (the Gateway API inference extension's endpoint picker with its
// P/D profile) sets for the routing sidecar of the decode pod it picked: x-prefiller-host-port
// (HOST:PORT of the prefill pod), or x-prefiller-url (http://HOST:PORT) in its older releases.
// Pure functions; any thread.
#pragma once

#include <string>

#include "http/api_error.h"

namespace pdserve::server {

inline constexpr char kPrefillPeerHeader[] = "X-Prefill-Peer";
inline constexpr char kPrefillerHostPortHeader[] = "x-prefiller-host-port";
inline constexpr char kPrefillerUrlHeader[] = "x-prefiller-url";

// The three headers' values as the request carried them ("" when absent).
struct PrefillPeerHeaders {
  std::string prefill_peer = {};
  std::string prefiller_host_port = {};
  std::string prefiller_url = {};
};

// The prefill peer named, as decode nodes name their peers ("HOST:PORT", as --prefill-peer and
// joins name them), or "" if no header names one. A value that is not an HTTP address, or two
// headers naming different nodes, is an invalid_request error naming the header.
http::ApiResult<std::string> PrefillPeerFromHeaders(const PrefillPeerHeaders& headers);

}  // namespace pdserve::server
