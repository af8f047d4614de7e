// A prefill node joins a decode node that is already running (`--decode-peer`): the decode node
// was started with no --prefill-peer, learns of the prefill node from its join
// (POST /internal/messenger/join, signed with the cluster secret), handshakes it and prefills
// through it, with the colocated node's tokens. Joins that do not prove the secret or name no
// node are refused. Real `pdserve serve` processes.
#include <gtest/gtest.h>
#include <httplib.h>

#include "disagg_util.h"
#include "http/cluster_auth.h"

namespace pdserve::testing {
namespace {

TEST(MessengerJoinTest, PrefillNodeJoinsARunningDecodeNode) {
  const std::vector<std::string> model_flags = {"--page-size", "4", "--max-batch-tokens", "8"};
  auto d_args = DecodeArgs("tcp", {}, model_flags);
  NodeProcess decode(TinyModelDir(), d_args);
  ASSERT_TRUE(decode.ok()) << decode.error();
  const int d = decode.port();
  EXPECT_EQ(NodeMetric(d, "pdserve:messenger_peers_ready"), 0);

  // Joins the decode node refuses: no cluster proof, a body that names no node.
  httplib::Client client("127.0.0.1", d);
  constexpr char kPath[] = "/internal/messenger/join";
  const std::string body = R"({"url": "http://127.0.0.1:1"})";
  auto unsigned_join = client.Post(kPath, body, "application/json");
  ASSERT_TRUE(unsigned_join);
  EXPECT_EQ(unsigned_join->status, 401) << unsigned_join->body;
  const std::string bad_body = R"({"url": "not a node"})";
  auto bad_url = client.Post(kPath, http::ClusterAuthHeaders(kClusterKey, "POST", kPath, bad_body),
                             bad_body, "application/json");
  ASSERT_TRUE(bad_url);
  EXPECT_EQ(bad_url->status, 400) << bad_url->body;
  EXPECT_NE(bad_url->body.find("invalid_registration"), std::string::npos) << bad_url->body;

  auto p_args = PrefillArgs("tcp", model_flags);
  p_args.insert(p_args.end(), {"--decode-peer", "http://127.0.0.1:" + std::to_string(d)});
  NodeProcess prefill(TinyModelDir(), p_args);
  ASSERT_TRUE(prefill.ok()) << prefill.error();
  ASSERT_EQ(WaitForMetric(d, "pdserve:messenger_peers_ready", 1, 20000), 1)
      << GetJson(d, "/internal/messenger/peers").dump();
  // Known by HOST:PORT, as a --prefill-peer is.
  const nlohmann::json peers = GetJson(d, "/internal/messenger/peers");
  ASSERT_TRUE(peers.is_array() && peers.size() == 1) << peers.dump();
  const std::string name = "127.0.0.1:" + std::to_string(prefill.port());
  EXPECT_EQ(peers[0]["name"], name);

  NodeProcess colocated(TinyModelDir(), model_flags);
  ASSERT_TRUE(colocated.ok()) << colocated.error();
  for (int length : {1, 9, 37}) {
    const std::vector<int32_t> prompt = RandomPrompt(length, 40 + length);
    const Completion want = Complete(colocated.port(), prompt, 8);
    const Completion got = Complete(d, prompt, 8, {{"X-Prefill-Peer", name}});
    ASSERT_EQ(want.status, 200) << want.body.dump();
    ASSERT_EQ(got.status, 200) << got.body.dump();
    EXPECT_EQ(got.token_ids, want.token_ids) << "prompt of " << length << " tokens";
  }
  EXPECT_GT(NodeMetric(prefill.port(), "pdserve:messenger_kv_writes_sent_total"), 0);
  ExpectNodeDrained(d);
  ExpectNodeDrained(prefill.port());
}

}  // namespace
}  // namespace pdserve::testing
