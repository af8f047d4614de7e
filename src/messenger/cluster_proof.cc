#include "messenger/cluster_proof.h"

#include <string>

#include "common/random_bytes.h"

namespace pdserve::messenger {
namespace {

constexpr std::string_view kProofLabel = "pdserve-hello";

}  // namespace

Result<Nonce> MakeNonce() {
  Nonce nonce;
  PD_RETURN_IF_ERROR(FillRandomBytes(nonce, "a handshake nonce"));
  return nonce;
}

ClusterProof MakeClusterProof(std::string_view secret, const Nonce& own_nonce,
                              const Nonce& peer_nonce, uint64_t own_incarnation) {
  std::string message(kProofLabel);
  message.append(reinterpret_cast<const char*>(own_nonce.data()), own_nonce.size());
  message.append(reinterpret_cast<const char*>(peer_nonce.data()), peer_nonce.size());
  for (int i = 0; i < 8; ++i) message.push_back(static_cast<char>(own_incarnation >> (8 * i)));
  return HmacSha256(secret, message);
}

Status VerifyClusterProof(std::string_view secret, const Nonce& own_nonce, const Nonce& peer_nonce,
                          uint64_t own_incarnation, uint64_t peer_incarnation,
                          const ClusterProof& proof) {
  // Both are fresh random values per process and handshake; equal ones mean our own
  // messages are being played back to us.
  if (peer_nonce == own_nonce || peer_incarnation == own_incarnation) {
    return Status::ProtocolError(
        "handshake refused: the peer echoed our own nonce or incarnation (a reflected handshake)");
  }
  const ClusterProof expected = MakeClusterProof(secret, peer_nonce, own_nonce, peer_incarnation);
  if (!ConstantTimeEqual(expected, proof)) {
    return Status::ProtocolError(
        "handshake refused: the peer did not prove the cluster secret (wrong secret, or a "
        "replayed handshake)");
  }
  return Status::Ok();
}

}  // namespace pdserve::messenger
