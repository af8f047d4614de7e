// Cluster proofs as pure functions (http/cluster_auth.h) and the cache that takes each once
// (http/cluster_proof_cache.h); the router refusing replays is in cluster_auth_test.cc.
#include <string>

#include <gtest/gtest.h>
#include <httplib.h>

#include "http/cluster_auth.h"
#include "http/cluster_proof_cache.h"

namespace pdserve::http {
namespace {

httplib::Request SignedRequest(const std::string& body, int64_t now,
                               const std::string& nonce = NewClusterNonce()) {
  httplib::Request req;
  req.method = "POST";
  req.path = "/internal/register";
  req.body = body;
  req.headers = ClusterAuthHeaders("secret", "POST", "/internal/register", body, now, nonce);
  return req;
}

TEST(ClusterAuthProofTest, CoversMethodPathBodyAndTime) {
  const int64_t now = 1'800'000'000;
  httplib::Request req = SignedRequest("{\"url\": \"http://a:1\"}", now);
  Result<ClusterProofStamp> stamp = VerifyClusterAuth(req, "secret", now);
  ASSERT_TRUE(stamp.ok()) << stamp.status().ToString();
  EXPECT_EQ(stamp->expires, now + kClusterProofWindow.count());
  EXPECT_EQ(stamp->nonce, req.get_header_value(kClusterNonceHeader));
  EXPECT_FALSE(VerifyClusterAuth(req, "other", now).ok());
  EXPECT_FALSE(VerifyClusterAuth(req, "secret", now + 2 * kClusterProofWindow.count()).ok());
  httplib::Request other_body = req;
  other_body.body = "{\"url\": \"http://thief:1\"}";
  EXPECT_FALSE(VerifyClusterAuth(other_body, "secret", now).ok());
  httplib::Request other_method = req;
  other_method.method = "GET";
  EXPECT_FALSE(VerifyClusterAuth(other_method, "secret", now).ok());
  httplib::Request bad_nonce = SignedRequest("", now, "not-hex");
  EXPECT_FALSE(VerifyClusterAuth(bad_nonce, "secret", now).ok());
  EXPECT_EQ(VerifyClusterAuth(req, "", now).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(NewClusterNonce(), NewClusterNonce());
}

TEST(ClusterProofReplayCacheTest, AdmitsEachProofOnceWithinItsWindow) {
  ClusterProofReplayCache cache(2);
  const int64_t now = 1000;
  EXPECT_TRUE(cache.Admit({"a", now + 60}, now));
  EXPECT_FALSE(cache.Admit({"a", now + 60}, now)) << "a replay";
  EXPECT_TRUE(cache.Admit({"b", now + 10}, now));
  EXPECT_FALSE(cache.Admit({"c", now + 60}, now)) << "full: refused, not forgotten";
  // Once b's window passed it is forgotten, and room is made.
  EXPECT_TRUE(cache.Admit({"c", now + 71}, now + 11));
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_FALSE(cache.Admit({"a", now + 60}, now + 30)) << "a is still within its window";
  EXPECT_TRUE(cache.Admit({"d", now + 200}, now + 61));
  EXPECT_EQ(cache.size(), 2u);
}

}  // namespace
}  // namespace pdserve::http
