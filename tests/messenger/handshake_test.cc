// A prefill peer that answers a Hello late: the decode node, after its handshake timeout, gives
// up on that Hello and sends another with a new nonce, and the late answer to the first then
// arrives. It must be told apart from a peer failing the cluster proof: before HelloAck named
// the Hello it answers, the decode node judged it against the new nonce and refused a healthy,
// merely slow prefill node "until it restarts" (seen under TSan, where nodes are slow).
//
// The prefill side is scripted in this process — an HTTP route with its fabric address and a
// transfer engine whose answers the test sends by hand — so that the answers can be timed; the
// decode node is a real `pdserve serve` process.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>

#include "disagg_util.h"
#include "fabric/transfer_engine.h"
#include "messenger/protocol.h"

namespace pdserve::testing {
namespace {

using messenger::ClusterProof;
using messenger::Hello;
using messenger::HelloAck;
using messenger::Nonce;

// The prefill side of the handshake, played by hand over a real transfer engine.
class ScriptedPrefill {
 public:
  explicit ScriptedPrefill(fabric::Provider provider) {
    fabric::FabricConfig config;
    config.provider = provider;
    if (provider == fabric::Provider::kTcp) config.node = "127.0.0.1";
    fabric::TransferEngineHandlers handlers;
    handlers.on_message = [this](fabric::PeerId, uint64_t /*instance*/,
                                 std::span<const std::byte> payload) {
      Result<messenger::Message> m = messenger::DecodeMessage(
          std::string_view(reinterpret_cast<const char*>(payload.data()), payload.size()));
      if (!m.ok() || !std::holds_alternative<Hello>(*m)) return;
      std::lock_guard lock(mu_);
      hellos_.push_back(std::get<Hello>(*m));
      cv_.notify_all();
    };
    auto engine = fabric::TransferEngine::Create(config, std::move(handlers));
    EXPECT_TRUE(engine.ok()) << engine.status().ToString();
    if (engine.ok()) engine_ = std::move(*engine);
    if (engine_ == nullptr) return;
    const std::string address = fabric::HexEncode(engine_->address().Serialize());
    http_.Get("/internal/messenger/fabric_address",
              [address](const httplib::Request&, httplib::Response& res) {
                res.set_content(address, "text/plain");
              });
    port_ = http_.bind_to_any_port("127.0.0.1");
    server_ = std::thread([this] { http_.listen_after_bind(); });
  }
  ~ScriptedPrefill() {
    http_.stop();
    if (server_.joinable()) server_.join();
  }

  int port() const { return port_; }

  // The n-th Hello received (0-based), waiting up to deadline_ms; nullopt if it never came.
  std::optional<Hello> WaitForHello(size_t n, int deadline_ms) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(deadline_ms), [&] { return hellos_.size() > n; });
    if (hellos_.size() <= n) return std::nullopt;
    return hellos_[n];
  }

  // Answers `hello` with a proof of `key` and `node` as this peer's NodeInfo.
  void Answer(const Hello& hello, const std::string& key, const messenger::NodeInfo& node) {
    auto reply = fabric::TransferEngineAddress::Parse(hello.reply_address);
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    auto peer = engine_->AddPeer(*reply);
    ASSERT_TRUE(peer.ok()) << peer.status().ToString();
    auto nonce = messenger::MakeNonce();
    ASSERT_TRUE(nonce.ok());
    const HelloAck ack{.incarnation = kIncarnation,
                       .nonce = *nonce,
                       .hello_nonce = hello.nonce,
                       .proof = messenger::MakeClusterProof(key, *nonce, hello.nonce, kIncarnation),
                       .node = node};
    auto bytes = messenger::EncodeMessage(ack);
    ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
    fabric::TransferCounter sent;
    ASSERT_TRUE(
        engine_
            ->Send(*peer,
                   std::span(reinterpret_cast<const std::byte*>(bytes->data()), bytes->size()),
                   fabric::Completion{nullptr, &sent})
            .ok());
    ASSERT_TRUE(sent.WaitFor(1, Deadline::AfterMs(10000)));
    EXPECT_EQ(sent.succeeded(), 1u);
  }

 private:
  static constexpr uint64_t kIncarnation = 0x5c417ed;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Hello> hellos_;
  std::unique_ptr<fabric::TransferEngine> engine_;
  httplib::Server http_;
  std::thread server_;
  int port_ = -1;
};

// A NodeInfo of a model the decode node does not serve: answering with it gets a refusal that
// names the difference, which the decode node reaches only once the proof has been verified.
messenger::NodeInfo ForeignNode() {
  auto shards = KvShardLayout::ForTensorParallel(2, 1);
  EXPECT_TRUE(shards.ok());
  messenger::NodeInfo n{.kernel_path = "generic",
                        .model_fingerprint = "sha256:00000000000000000000000000000000",
                        .kv = {.shards = *shards, .ranks = {}},
                        .rank_memory = {"unused"}};
  n.kv.ranks.push_back(KvLayout{.num_layers = 3,
                                .num_kv_heads = 2,
                                .head_dim = 8,
                                .page_tokens = 4,
                                .dtype = DType::kBF16,
                                .num_pages = 16});
  return n;
}

// The decode node's view of its one prefill peer (an empty object if it does not answer).
nlohmann::json PeerStatus(int decode_port) {
  const nlohmann::json peers = GetJson(decode_port, "/internal/messenger/peers");
  if (!peers.is_array() || peers.size() != 1 || !peers[0].is_object()) {
    return nlohmann::json::object();
  }
  return peers[0];
}

class MessengerSlowHandshakeTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MessengerSlowHandshakeTest, LateAnswerToAnEarlierHelloIsNotARefusal) {
  const fabric::Provider provider =
      GetParam() == "tcp" ? fabric::Provider::kTcp : fabric::Provider::kShm;
  ScriptedPrefill prefill(provider);
  ASSERT_GT(prefill.port(), 0);
  // The handshake timeout is the decode node's --peer-timeout-ms.
  constexpr int kHandshakeTimeoutMs = 2000;
  auto decode = std::make_unique<NodeProcess>(
      TinyModelDir(), DecodeArgs(GetParam(), {prefill.port()},
                                 {"--heartbeat-ms", "100", "--peer-timeout-ms",
                                  std::to_string(kHandshakeTimeoutMs)}));
  ASSERT_TRUE(decode->ok()) << decode->error();
  const int d = decode->port();

  const std::optional<Hello> first = prefill.WaitForHello(0, 20000);
  ASSERT_TRUE(first.has_value()) << "the decode node never said hello";
  // Unanswered, it times out and the decode node says hello again with a new nonce.
  const std::optional<Hello> second = prefill.WaitForHello(1, 4 * kHandshakeTimeoutMs);
  ASSERT_TRUE(second.has_value()) << "the decode node did not retry an unanswered hello";
  ASSERT_NE(first->nonce, second->nonce);

  // Now the slow peer's answer to the first Hello arrives: a correct proof for that Hello.
  prefill.Answer(*first, kClusterKey, ForeignNode());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const nlohmann::json after_late = PeerStatus(d);
  ASSERT_TRUE(after_late.contains("refused")) << "no status of the prefill peer";
  EXPECT_FALSE(after_late.value("refused", true))
      << "a late answer to an earlier hello was taken for a failed proof: " << after_late.dump();

  // The answer to the current Hello is judged: its proof passes and the model is refused by
  // name (the peer serves another model), not the proof. Answer the newest Hello seen, in case
  // another timeout passed meanwhile.
  std::optional<Hello> newest = second;
  for (size_t n = 2; auto h = prefill.WaitForHello(n, 0); ++n) newest = h;
  prefill.Answer(*newest, kClusterKey, ForeignNode());
  nlohmann::json refused = nlohmann::json::object();
  for (int i = 0; i < 50 && !refused.value("refused", false); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    refused = PeerStatus(d);
  }
  ASSERT_TRUE(refused.value("refused", false)) << refused.dump();
  const std::string why = refused.value("last_error", "");
  EXPECT_NE(why.find("kernel path differs"), std::string::npos) << why;
  EXPECT_EQ(why.find("did not prove"), std::string::npos) << why;
}

INSTANTIATE_TEST_SUITE_P(Providers, MessengerSlowHandshakeTest, ::testing::Values("tcp", "shm"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace pdserve::testing
