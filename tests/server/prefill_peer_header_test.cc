// Unit tests of the prefill node a request names by header (server/prefill_peer_header.h):
// pdserve's X-Prefill-Peer and llm-d's x-prefiller-host-port / x-prefiller-url.
#include "server/prefill_peer_header.h"

#include <gtest/gtest.h>

namespace pdserve::server {
namespace {

std::string PeerOf(const PrefillPeerHeaders& h) {
  http::ApiResult<std::string> peer = PrefillPeerFromHeaders(h);
  EXPECT_TRUE(peer.ok()) << peer.error().message;
  return peer.ok() ? peer.value() : "";
}

TEST(PrefillPeerHeaderTest, EachHeaderNamesHostPort) {
  EXPECT_EQ(PeerOf({}), "");
  EXPECT_EQ(PeerOf({.prefill_peer = "127.0.0.1:8101"}), "127.0.0.1:8101");
  EXPECT_EQ(PeerOf({.prefiller_host_port = "10.1.2.3:8000"}), "10.1.2.3:8000");
  EXPECT_EQ(PeerOf({.prefiller_url = "http://10.1.2.3:8000"}), "10.1.2.3:8000");
  EXPECT_EQ(PeerOf({.prefiller_url = "http://p-0.prefill:8000/"}), "p-0.prefill:8000");
  // Several naming the same node are one choice.
  EXPECT_EQ(
      PeerOf({.prefill_peer = "http://10.1.2.3:8000", .prefiller_host_port = "10.1.2.3:8000"}),
      "10.1.2.3:8000");
}

TEST(PrefillPeerHeaderTest, BadOrConflictingHeadersAreInvalidRequests) {
  struct Case {
    PrefillPeerHeaders headers;
    const char* blamed;
  };
  const Case cases[] = {
      {{.prefiller_host_port = "10.1.2.3"}, "x-prefiller-host-port"},  // no port
      {{.prefiller_url = "https://10.1.2.3:8000"}, "x-prefiller-url"},
      {{.prefiller_url = "http://10.1.2.3:8000/v1"}, "x-prefiller-url"},
      {{.prefill_peer = "a:1", .prefiller_host_port = "b:1"}, "x-prefiller-host-port"},
      {{.prefiller_host_port = "a:1", .prefiller_url = "http://a:2"}, "x-prefiller-url"},
  };
  for (const Case& c : cases) {
    http::ApiResult<std::string> peer = PrefillPeerFromHeaders(c.headers);
    ASSERT_FALSE(peer.ok()) << c.blamed;
    EXPECT_EQ(peer.error().http_status, 400);
    EXPECT_EQ(peer.error().param, c.blamed);
    EXPECT_NE(peer.error().message.find(c.blamed), std::string::npos) << peer.error().message;
  }
}

}  // namespace
}  // namespace pdserve::server
