// Refused handshakes end to end (DESIGN.md §3.1): a prefill node with the wrong cluster key, on
// another checkpoint of the same model or on a model of another shape is refused by the decode
// node with a message naming the cause (its /internal/messenger/peers and the errors of the
// requests it cannot serve); the refused node never becomes ready nor gets a request (the
// decode node's memory descriptor travels only in HelloFinish, sent after the peer proved the
// secret and matched the model). The decode node keeps serving through a correct prefill node,
// and fails at once, naming the reasons, requests that only refused nodes could take. Real
// `pdserve serve` processes over tcp.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include <gtest/gtest.h>

#include "disagg_util.h"
#include "model/synthetic.h"
#include "testing/test_paths.h"

namespace pdserve::testing {
namespace {

std::unique_ptr<NodeProcess> StartKeyedPrefill(const std::string& model_dir, const std::string& key,
                                               const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {"--role",        "prefill", "--fabric-provider",  "tcp",
                                   "--cluster-key", key,       "--max-batch-tokens", "16"};
  args.insert(args.end(), extra.begin(), extra.end());
  args.insert(args.end(), kQuickPeerLossFlags.begin(), kQuickPeerLossFlags.end());
  return std::make_unique<NodeProcess>(model_dir, args);
}

// The tiny preset with weights of another seed: the same config, another checkpoint.
std::string OtherCheckpointDir() {
  namespace fs = std::filesystem;
  const std::string dir = BinaryPath("test-models/tiny-seed2-BF16");
  if (fs::exists(dir + "/config.json")) return dir;
  fs::create_directories(BinaryPath("test-models"));
  const std::string tmp = dir + ".tmp." + std::to_string(getpid());
  fs::remove_all(tmp);
  const Status s = WriteSyntheticModel("tiny", tmp, /*seed=*/2, DType::kBF16);
  EXPECT_TRUE(s.ok()) << s.ToString();
  std::error_code ec;
  fs::rename(tmp, dir, ec);  // fails harmlessly if another process got there first
  if (ec) fs::remove_all(tmp);
  return dir;
}

// The decode node's view of prefill peer `name` once it was refused (polled up to 20 s); a
// discarded value if it never was.
nlohmann::json WaitUntilRefused(int decode_port, const std::string& name) {
  for (int i = 0; i < 200; ++i) {
    const nlohmann::json peers = GetJson(decode_port, "/internal/messenger/peers");
    if (peers.is_array()) {
      for (const nlohmann::json& p : peers) {
        if (p.value("name", "") == name && p.value("refused", false)) return p;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return nlohmann::json::value_t::discarded;
}

TEST(MessengerRefusalTest, WrongClusterKeyIsRefusedAndTheGoodPeerServes) {
  auto good = StartKeyedPrefill(TinyModelDir(), kClusterKey);
  auto bad = StartKeyedPrefill(TinyModelDir(), "not-the-cluster-secret");
  ASSERT_TRUE(good->ok()) << good->error();
  ASSERT_TRUE(bad->ok()) << bad->error();
  auto decode = std::make_unique<NodeProcess>(
      TinyModelDir(), DecodeArgs("tcp", {bad->port(), good->port()}, kQuickPeerLossFlags));
  ASSERT_TRUE(decode->ok()) << decode->error();

  const nlohmann::json refused = WaitUntilRefused(decode->port(), PeerName(*bad));
  ASSERT_FALSE(refused.is_discarded()) << GetJson(decode->port(), "/internal/messenger/peers");
  EXPECT_NE(refused.value("last_error", "").find("did not prove the cluster secret"),
            std::string::npos)
      << refused.dump();
  EXPECT_EQ(WaitForMetric(decode->port(), "pdserve:messenger_peers_ready", 1, 20000), 1);
  // The wrong-key node never completed a handshake, so it never got D's memory descriptor.
  EXPECT_EQ(NodeMetric(bad->port(), "pdserve:messenger_peers_ready"), 0);

  for (int i = 0; i < 4; ++i) {
    const Completion c = Complete(decode->port(), RandomPrompt(9 + 7 * i, 40 + i), 3);
    EXPECT_EQ(c.status, 200) << c.body.dump();
    EXPECT_EQ(c.token_ids.size(), 3u);
  }
  // A request pinned to the refused node fails at once with the reason, not at its deadline.
  const auto start = std::chrono::steady_clock::now();
  const Completion pinned =
      Complete(decode->port(), RandomPrompt(9, 5), 3, {{"X-Prefill-Peer", PeerName(*bad)}});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_NE(pinned.status, 200);
  EXPECT_NE(ErrorMessage(pinned).find("did not prove the cluster secret"), std::string::npos)
      << ErrorMessage(pinned);

  EXPECT_EQ(NodeMetric(bad->port(), "pdserve:messenger_requests_in_flight"), 0);
  EXPECT_EQ(NodeMetric(bad->port(), "pdserve:messenger_peers_ready"), 0);
  ExpectNodeDrained(decode->port());
  ExpectNodeDrained(good->port());
}

TEST(MessengerRefusalTest, IncompatibleModelsAreRefusedNamingTheDifference) {
  auto checkpoint = StartKeyedPrefill(OtherCheckpointDir(), kClusterKey);
  auto shape = StartKeyedPrefill(SyntheticModelDir("tiny-llama3"), kClusterKey);
  // The same checkpoint with its linear layers quantised to int8 at load: other KV.
  auto int8 = StartKeyedPrefill(TinyModelDir(), kClusterKey, {"--weights", "int8"});
  ASSERT_TRUE(checkpoint->ok()) << checkpoint->error();
  ASSERT_TRUE(shape->ok()) << shape->error();
  ASSERT_TRUE(int8->ok()) << int8->error();
  // Without local fallback, so that a request with no usable peer is refused, naming why.
  auto decode = std::make_unique<NodeProcess>(
      TinyModelDir(), DecodeArgs("tcp", {checkpoint->port(), shape->port(), int8->port()}, [] {
        auto flags = kQuickPeerLossFlags;
        flags.insert(flags.end(), {"--local-prefill-fallback", "off"});
        return flags;
      }()));
  ASSERT_TRUE(decode->ok()) << decode->error();

  const nlohmann::json other_weights = WaitUntilRefused(decode->port(), PeerName(*checkpoint));
  ASSERT_FALSE(other_weights.is_discarded())
      << GetJson(decode->port(), "/internal/messenger/peers");
  const std::string weights_error = other_weights.value("last_error", "");
  EXPECT_NE(weights_error.find("model weights differ"), std::string::npos) << weights_error;
  EXPECT_EQ(weights_error.find("config differs"), std::string::npos) << weights_error;

  const nlohmann::json other_shape = WaitUntilRefused(decode->port(), PeerName(*shape));
  ASSERT_FALSE(other_shape.is_discarded()) << GetJson(decode->port(), "/internal/messenger/peers");
  const std::string shape_error = other_shape.value("last_error", "");
  EXPECT_NE(shape_error.find("model config differs"), std::string::npos) << shape_error;
  EXPECT_NE(shape_error.find("KV layout differs"), std::string::npos) << shape_error;

  const nlohmann::json other_format = WaitUntilRefused(decode->port(), PeerName(*int8));
  ASSERT_FALSE(other_format.is_discarded()) << GetJson(decode->port(), "/internal/messenger/peers");
  const std::string format_error = other_format.value("last_error", "");
  EXPECT_NE(format_error.find("weight dtype or format differs"), std::string::npos) << format_error;
  EXPECT_NE(format_error.find("weights=bf16/int8"), std::string::npos) << format_error;
  EXPECT_EQ(format_error.find("model weights differ"), std::string::npos) << format_error;

  // No usable prefill node: a request fails at once, naming both reasons.
  const auto start = std::chrono::steady_clock::now();
  const Completion c = Complete(decode->port(), RandomPrompt(13, 6), 3);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_EQ(c.status, 503);
  EXPECT_FALSE(c.retry_after.empty());
  const std::string message = ErrorMessage(c);
  EXPECT_NE(message.find("no usable prefill peer"), std::string::npos) << message;
  EXPECT_NE(message.find("model weights differ"), std::string::npos) << message;
  EXPECT_NE(message.find("model config differs"), std::string::npos) << message;
  EXPECT_EQ(NodeMetric(checkpoint->port(), "pdserve:messenger_peers_ready"), 0);
  EXPECT_EQ(NodeMetric(shape->port(), "pdserve:messenger_peers_ready"), 0);
  EXPECT_EQ(NodeMetric(int8->port(), "pdserve:messenger_peers_ready"), 0);
  ExpectNodeDrained(decode->port());
}

// The identity holds the formats the nodes loaded, not their flags: on an INT8 checkpoint a
// decode node with `--weights auto` (the checkpoint's own) and a prefill node with `--weights
// int8` hold the same weights and serve together — also when only their lm_heads differ (the
// prefill node's kept BF16, the decode node's INT8 by auto: the head changes no KV, and the
// prefill node never picks a token); a prefill node with `--weights bf16` (the checkpoint
// dequantised) would compute other KV and is refused, naming both formats.
TEST(MessengerRefusalTest, ResolvedWeightFormatsAreComparedNotFlags) {
  const std::string int8_dir = SyntheticModelDir("tiny", DType::kI8);
  auto same = StartKeyedPrefill(int8_dir, kClusterKey, {"--weights", "int8", "--lm-head", "bf16"});
  auto bf16 = StartKeyedPrefill(int8_dir, kClusterKey, {"--weights", "bf16"});
  ASSERT_TRUE(same->ok()) << same->error();
  ASSERT_TRUE(bf16->ok()) << bf16->error();
  auto decode = std::make_unique<NodeProcess>(
      int8_dir, DecodeArgs("tcp", {same->port(), bf16->port()}, [] {
        auto flags = kQuickPeerLossFlags;
        flags.insert(flags.end(), {"--local-prefill-fallback", "off"});
        return flags;
      }()));
  ASSERT_TRUE(decode->ok()) << decode->error();

  const nlohmann::json refused = WaitUntilRefused(decode->port(), PeerName(*bf16));
  ASSERT_FALSE(refused.is_discarded()) << GetJson(decode->port(), "/internal/messenger/peers");
  const std::string error = refused.value("last_error", "");
  EXPECT_NE(error.find("weight dtype or format differs"), std::string::npos) << error;
  EXPECT_NE(error.find("prefill weights=bf16,"), std::string::npos) << error;
  EXPECT_NE(error.find("decode weights=bf16/int8"), std::string::npos) << error;
  EXPECT_EQ(error.find("model weights differ"), std::string::npos) << error;

  EXPECT_EQ(WaitForMetric(decode->port(), "pdserve:messenger_peers_ready", 1, 20000), 1);
  EXPECT_EQ(WaitForMetric(same->port(), "pdserve:messenger_peers_ready", 1, 20000), 1);
  for (int i = 0; i < 3; ++i) {
    const Completion c = Complete(decode->port(), RandomPrompt(21 + i, 30 + i), 3,
                                  {{"X-Prefill-Peer", PeerName(*same)}});
    EXPECT_EQ(c.status, 200) << c.body.dump();
    EXPECT_EQ(c.token_ids.size(), 3u);
  }
  EXPECT_EQ(NodeMetric(bf16->port(), "pdserve:messenger_peers_ready"), 0);
  ExpectNodeDrained(decode->port());
  ExpectNodeDrained(same->port());
}

}  // namespace
}  // namespace pdserve::testing
