// Serialisable descriptions exchanged between engines during a handshake: an engine's
// address (its endpoints, one per domain) and the descriptor of a registered memory region
// (base and key per domain). Plain value types; thread-compatible. Parse never trusts its
// input: truncated, oversized or inconsistent bytes give InvalidArgument/DataLoss.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "fabric/config.h"

namespace pdserve::fabric {

// Where a remote writer aims within one domain of the owner. `base` is the virtual address
// of the region for providers with FI_MR_VIRT_ADDR and 0 for offset-addressed ones; the
// engine adds offsets to it either way.
struct RemoteKey {
  uint64_t base = 0;
  uint64_t key = 0;
  friend bool operator==(const RemoteKey&, const RemoteKey&) = default;
};

struct MemoryDescriptor {
  uint64_t length = 0;
  std::vector<RemoteKey> domains;  // index = the owning engine's domain index

  std::string Serialize() const;
  static Result<MemoryDescriptor> Parse(std::string_view bytes);
  friend bool operator==(const MemoryDescriptor&, const MemoryDescriptor&) = default;
};

struct TransferEngineAddress {
  Provider provider = Provider::kShm;
  // Random per engine instance; identifies the sender of control messages even before the
  // receiver has added it as a peer.
  uint64_t instance = 0;
  std::vector<std::string> endpoints;  // fi_getname bytes, one per domain

  std::string Serialize() const;
  static Result<TransferEngineAddress> Parse(std::string_view bytes);
  friend bool operator==(const TransferEngineAddress&, const TransferEngineAddress&) = default;
};

// Lower-case hex, for carrying the serialised forms in text (CLI, test pipes, JSON).
std::string HexEncode(std::string_view bytes);
Result<std::string> HexDecode(std::string_view hex);

}  // namespace pdserve::fabric
