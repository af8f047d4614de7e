#include "messenger/cluster_proof.h"

#include <gtest/gtest.h>

namespace pdserve::messenger {
namespace {

constexpr std::string_view kSecret = "correct horse battery staple";
constexpr uint64_t kDecodeIncarnation = 0x1111222233334444;
constexpr uint64_t kPrefillIncarnation = 0x5555666677778888;

Nonce Fresh() {
  auto n = MakeNonce();
  EXPECT_TRUE(n.ok()) << n.status().ToString();
  return n.ok() ? *n : Nonce{};
}

TEST(ClusterProofTest, BothSidesAcceptEachOthersProof) {
  const Nonce d_nonce = Fresh(), p_nonce = Fresh();
  const ClusterProof p_proof = MakeClusterProof(kSecret, p_nonce, d_nonce, kPrefillIncarnation);
  const ClusterProof d_proof = MakeClusterProof(kSecret, d_nonce, p_nonce, kDecodeIncarnation);
  EXPECT_TRUE(VerifyClusterProof(kSecret, d_nonce, p_nonce, kDecodeIncarnation, kPrefillIncarnation,
                                 p_proof)
                  .ok());
  EXPECT_TRUE(VerifyClusterProof(kSecret, p_nonce, d_nonce, kPrefillIncarnation, kDecodeIncarnation,
                                 d_proof)
                  .ok());
  // The two directions' proofs differ (the nonces are in swapped order).
  EXPECT_NE(p_proof, d_proof);
}

TEST(ClusterProofTest, WrongSecretFails) {
  const Nonce d_nonce = Fresh(), p_nonce = Fresh();
  const ClusterProof proof =
      MakeClusterProof("not the secret", p_nonce, d_nonce, kPrefillIncarnation);
  const Status s =
      VerifyClusterProof(kSecret, d_nonce, p_nonce, kDecodeIncarnation, kPrefillIncarnation, proof);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError);
  EXPECT_NE(s.message().find("cluster secret"), std::string::npos) << s.ToString();
}

TEST(ClusterProofTest, ReplayedProofFailsAgainstAFreshNonce) {
  // An eavesdropper records P's proof for D's first nonce and replays it when D, in a new
  // handshake, challenges with a fresh nonce.
  const Nonce first_challenge = Fresh(), p_nonce = Fresh();
  const ClusterProof recorded =
      MakeClusterProof(kSecret, p_nonce, first_challenge, kPrefillIncarnation);
  const Nonce second_challenge = Fresh();
  ASSERT_NE(first_challenge, second_challenge);
  EXPECT_FALSE(VerifyClusterProof(kSecret, second_challenge, p_nonce, kDecodeIncarnation,
                                  kPrefillIncarnation, recorded)
                   .ok());
  // A proof bound to another incarnation (a restarted peer's) fails too.
  EXPECT_FALSE(VerifyClusterProof(kSecret, first_challenge, p_nonce, kDecodeIncarnation,
                                  kPrefillIncarnation + 1, recorded)
                   .ok());
}

TEST(ClusterProofTest, ReflectedHandshakeFails) {
  // Our own nonce or incarnation coming back means our messages are being played to us.
  const Nonce nonce = Fresh();
  const ClusterProof mine = MakeClusterProof(kSecret, nonce, nonce, kDecodeIncarnation);
  EXPECT_FALSE(
      VerifyClusterProof(kSecret, nonce, nonce, kDecodeIncarnation, kPrefillIncarnation, mine)
          .ok());
  const Nonce other = Fresh();
  const ClusterProof reflected = MakeClusterProof(kSecret, other, nonce, kDecodeIncarnation);
  EXPECT_FALSE(
      VerifyClusterProof(kSecret, nonce, other, kDecodeIncarnation, kDecodeIncarnation, reflected)
          .ok());
}

TEST(ClusterProofTest, NoncesAreFresh) { EXPECT_NE(Fresh(), Fresh()); }

}  // namespace
}  // namespace pdserve::messenger
