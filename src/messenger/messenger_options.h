// Options shared by the prefill and decode messengers, and what each node says about itself in
// the handshake (DESIGN.md §3.1). Plain value types; thread-compatible.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "fabric/config.h"
#include "messenger/admission.h"

namespace pdserve::messenger {

struct MessengerOptions {
  fabric::FabricConfig fabric;
  // The cluster secret both sides prove in the handshake. Required (non-empty).
  std::string cluster_key;
  // The served model's ModelIdentity::Serialize() (common/model_identity.h; built by
  // model/fingerprint.h's IdentifyModel). The handshake compares it field by field.
  std::string model_fingerprint;
  // The kernels' ISA path (kernels::ActivePath()); both sides must compute the same bits.
  std::string kernel_path;
  // Heartbeats: sent every interval; a peer silent for peer_timeout is removed.
  std::chrono::milliseconds heartbeat_interval{250};
  std::chrono::milliseconds peer_timeout{3000};
  // How long D waits for a handshake answer before it retries the peer.
  std::chrono::milliseconds handshake_timeout{3000};
  // D: how long the KV of one request may take to land; P: the deadline it gets (relative).
  std::chrono::milliseconds prefill_timeout{60000};
  // D: how many times a request is moved to another prefill peer after its peer died.
  int max_retries = 1;
  // D: prompts of at most this many tokens are prefilled by the decode node itself (chunked, as
  // colocated) unless the request names a prefill peer: for them a round trip to P costs more
  // than the local prefill (docs/messenger.md, "Conditional disaggregation"). 0: never.
  int local_prefill_max_tokens = 0;
  // D: a request that needs a prefill peer when none is usable (none ready or handshaking,
  // every one removed or refused) is prefilled by this node instead of failing at once with
  // 503. A request that names its peer (X-Prefill-Peer) never falls back.
  bool local_prefill_fallback = true;
  // D: what a request whose estimated KV wait (the least loaded peer's queued tokens and this
  // prompt over its measured prefill rate) exceeds prefill_timeout becomes (docs/messenger.md,
  // "Admission"): kLocal prefills it here while this node prefills at most
  // admission_local_max_tokens prompt tokens so (this one included) and its free pages hold the
  // prompt, else refuses it with 503 and Retry-After; kRefuse always refuses; kOff lets it wait.
  AdmissionPolicy admission = AdmissionPolicy::kLocal;
  int admission_local_max_tokens = 4096;
  // P: post each layer's final pages while the forward pass runs (DESIGN.md §3.3). Off: a
  // request's writes are all posted after its last forward pass (the benchmark's baseline).
  bool kv_streaming = true;
};

}  // namespace pdserve::messenger
