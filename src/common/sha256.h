// SHA-256 (FIPS 180-4), HMAC-SHA-256 (RFC 2104) and a constant-time comparison: enough
// cryptography for the cluster-secret proof of the messenger handshake, written here because
// the project links no crypto library. Not for bulk data; not hardened against side channels
// beyond the comparison.
// A Sha256 object is thread-compatible (one thread at a time); the free functions are pure and
// safe from any thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace pdserve {

using Sha256Digest = std::array<uint8_t, 32>;

// Incremental hashing: Update any number of times, then Finish once.
class Sha256 {
 public:
  Sha256();
  void Update(std::span<const uint8_t> data);
  void Update(std::string_view data);
  // Precondition: not called before on this object.
  Sha256Digest Finish();

 private:
  void Compress(const uint8_t* block);

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
  bool finished_ = false;
};

Sha256Digest Sha256Hash(std::string_view data);

// HMAC-SHA-256 of `message` under `key` (any key length; keys over 64 bytes are hashed first).
Sha256Digest HmacSha256(std::string_view key, std::string_view message);

// Whether a and b are equal, in time that depends only on their lengths (which are public),
// never on where they first differ.
bool ConstantTimeEqual(std::span<const uint8_t> a, std::span<const uint8_t> b);

}  // namespace pdserve
