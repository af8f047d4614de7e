// The KV messenger side of `pdserve serve --role prefill|decode`: its flags, and the role's
// front built from them (server/disagg_fronts.h, DESIGN.md §1). Used from serve's main thread
// only.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/status.h"
#include "engine/engine.h"
#include "server/role_front.h"

namespace pdserve::cli {

// Prompts of at most this many tokens are prefilled by the decode node itself; measured on this
// project's CPUs (docs/messenger.md, "Conditional disaggregation").
inline constexpr int kDefaultLocalPrefillMaxTokens = 8;

struct MessengerFlags {
  std::string provider = "tcp";  // tcp over loopback by default: see docs/messenger.md
  std::string address = "127.0.0.1";
  std::vector<std::string> prefill_peers;  // decode: prefill nodes' HTTP addresses
  std::vector<std::string> decode_peers;   // prefill: decode nodes to join (serve.cc joins)
  std::string cluster_key;                 // or PDSERVE_CLUSTER_KEY
  int heartbeat_ms = 250;
  int peer_timeout_ms = 3000;
  int prefill_timeout_ms = 60000;
  int local_prefill_max_tokens = kDefaultLocalPrefillMaxTokens;  // decode role
  std::string local_prefill_fallback = "on";  // decode: with no usable prefill peer, prefill here
  std::string kv_streaming = "on";            // prefill: on | off (off: the benchmark's baseline)
  std::string admission = "local";            // decode: off | refuse | local
  int admission_local_max_tokens = 4096;      // decode: bound of --admission local
};

void AddMessengerFlags(CLI::App* cmd, MessengerFlags* flags);

// The role's front (server/role_front.h): for prefill and decode, its KV messenger over
// `engine` with the options the flags give. `fingerprint` identifies the model (config, weights,
// weight dtype).
Result<std::unique_ptr<server::RoleFront>> MakeRoleFront(server::NodeRole role,
                                                         const MessengerFlags& flags,
                                                         const std::string& fingerprint,
                                                         Engine* engine);

}  // namespace pdserve::cli
