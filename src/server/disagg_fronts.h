// The fronts of the disaggregated roles (DESIGN.md §1; server/role_front.h): a prefill node
// (its PrefillMessenger: the generation API answers 404; /internal/messenger/fabric_address is
// where decode nodes find its transfer engine) and a decode node (its DecodeMessenger: requests
// submitted for remote prefill, X-Prefill-Peer honoured, joins taken, /health degraded without
// a usable prefill peer). Each front owns its messenger; see role_front.h for threads and
// lifetime. What each exposes is read here and in disagg_fronts.cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/engine.h"
#include "messenger/messenger_options.h"
#include "server/role_front.h"

namespace pdserve::server {

// `engine` must outlive the front, and its loop must be stopped before the front is destroyed.
Result<std::unique_ptr<RoleFront>> MakePrefillFront(Engine* engine,
                                                    messenger::MessengerOptions options);
// `prefill_peers`: prefill nodes' HTTP addresses (HOST:PORT or http://HOST:PORT; none is fine:
// prefill nodes may join). Each is resolved over HTTP with a proof of options.cluster_key.
Result<std::unique_ptr<RoleFront>> MakeDecodeFront(Engine* engine,
                                                   messenger::MessengerOptions options,
                                                   const std::vector<std::string>& prefill_peers);

}  // namespace pdserve::server
