// ModelIdentity: what two nodes compare before one continues the other's KV cache (DESIGN.md
// §3.1: a mismatch is refused by name, never found by garbage tokens). model/fingerprint.h's
// IdentifyModel builds it from a model directory; the messenger's handshake carries its
// Serialize() form ("config=…;files=…;weights=…") and its Compare names what differs. It lives
// in common/ because both sides of that seam use it: model/ builds it and messenger/, which
// may not include model/ (DESIGN.md §2), parses and compares it.
// A plain value type; thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace pdserve {

struct ModelIdentity {
  // ModelConfig::Fingerprint(): the forward-relevant fields of config.json.
  uint64_t config = 0;
  // ModelFingerprint(): 32 hex characters over the config and samples of every weight file.
  std::string files;
  // The dtypes the weights are held in, as resolved at load: the matrices' ("bf16", "f32") and
  // the linear layers' when 8-bit ("bf16/int8", model/fingerprint.h's WeightsIdentity); they
  // change the forward pass, hence the KV bits.
  std::string weights;
  // The KV layers beyond the decoder's: "mtp" when the cache holds the MTP module's
  // (`--speculative mtp`: P writes it, D drafts from it), else "plain".
  std::string kv = "plain";

  // "config=<16 hex digits>;files=<files>;weights=<weights>;kv=<kv>". Precondition: no string
  // holds a ';'.
  std::string Serialize() const;
  // The inverse of Serialize, which is canonical: exactly those four fields in that order,
  // the config as 16 lower-case hex digits. InvalidArgument otherwise.
  static Result<ModelIdentity> Parse(std::string_view text);

  // One line per differing field, naming what the difference means and both values, e.g.
  // "model weights differ (another checkpoint): prefill files=…, decode files=…" for sides
  // named "prefill" and "decode". Empty when equal. The files digest covers the config, so a
  // differing config is not also reported as differing files.
  static std::vector<std::string> Compare(const ModelIdentity& a, std::string_view a_name,
                                          const ModelIdentity& b, std::string_view b_name);

  friend bool operator==(const ModelIdentity&, const ModelIdentity&) = default;
};

}  // namespace pdserve
