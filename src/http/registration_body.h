// The body with which a node announces itself to another process of its cluster: a node
// registering with a router (POST /internal/register) and a prefill node joining a decode node
// (POST /internal/messenger/join) both send {"url": "http://host:port"}, the address at which
// they serve HTTP. server/node_registration.h builds it; the router and the decode node's front
// parse it here, so sender and receivers cannot drift apart. Pure functions; any thread.
#pragma once

#include <string>
#include <string_view>

#include "http/api_error.h"
#include "http/node_url.h"

namespace pdserve::http {

// {"url": "<node.url>"}.
std::string RegistrationBody(const NodeAddress& node);

// The address a registration body names. Refused (400 invalid_registration, param "url", with
// a message saying what is wrong) unless the body is a JSON object whose "url" is a string
// that ParseNodeUrl takes; other members are ignored.
ApiResult<NodeAddress> ParseRegistrationBody(std::string_view body);

}  // namespace pdserve::http
