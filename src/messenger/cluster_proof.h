// The cluster-secret proof of the messenger handshake: challenge-response with HMAC-SHA-256,
// so the secret never travels and a recorded handshake cannot be replayed.
//
// Each side sends a fresh random nonce; each then proves it holds the secret with
//   proof = HMAC(secret, "pdserve-hello" || own nonce || peer nonce || own incarnation (u64 LE))
// and checks the peer's proof with the roles swapped. A replayed proof was made for another
// nonce of ours and fails. A proof reflected back at its maker (an attacker relaying our own
// handshake to us) carries our own incarnation and nonce, which Verify refuses.
// Pure functions apart from MakeNonce (reads the kernel's CSPRNG); safe from any thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/sha256.h"
#include "common/status.h"

namespace pdserve::messenger {

inline constexpr size_t kNonceBytes = 32;
using Nonce = std::array<uint8_t, kNonceBytes>;
using ClusterProof = Sha256Digest;

// A nonce from getrandom(2). IoError if the kernel's generator cannot be read.
Result<Nonce> MakeNonce();

ClusterProof MakeClusterProof(std::string_view secret, const Nonce& own_nonce,
                              const Nonce& peer_nonce, uint64_t own_incarnation);

// Ok if `proof` is MakeClusterProof(secret, peer_nonce, own_nonce, peer_incarnation), as the
// peer computes it; otherwise ProtocolError that says the peer did not prove the secret.
// Compared in constant time.
Status VerifyClusterProof(std::string_view secret, const Nonce& own_nonce, const Nonce& peer_nonce,
                          uint64_t own_incarnation, uint64_t peer_incarnation,
                          const ClusterProof& proof);

}  // namespace pdserve::messenger
