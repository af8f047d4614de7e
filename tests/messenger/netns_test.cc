// The cross-host case (DESIGN.md §6, §7): the prefill node runs in a network namespace of its
// own, joined to this one (the decode node's) only by a veth pair, and the KV travels over tcp
// on it; the decode node returns the colocated node's greedy tokens. The test creates and
// removes the namespace itself; without root (CAP_NET_ADMIN) or iproute2 it is SKIPPED, loudly.
#include <unistd.h>

#include <chrono>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/subprocess.h"
#include "disagg_util.h"
#include "testing/test_paths.h"

namespace pdserve::testing {
namespace {

const std::vector<std::string> kFlags = {"--page-size", "4",         "--max-batch-tokens",
                                         "8",           "--threads", "1"};

std::string IpBinary() {
  for (const char* path : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (access(path, X_OK) == 0) return path;
  }
  return "";
}

// Runs `ip <args>`; its exit status (127 if it could not run).
int RunIp(const std::vector<std::string>& args) {
  SubprocessOptions options;
  options.argv = {IpBinary()};
  options.argv.insert(options.argv.end(), args.begin(), args.end());
  options.stdout_mode = StdStream::kNull;
  options.stderr_mode = StdStream::kNull;
  auto process = Subprocess::Spawn(options);
  if (!process.ok()) return 127;
  auto status = process->WaitFor(Deadline::AfterMs(30000));
  if (!status.ok()) return 127;
  return status->exited() ? status->code : 128;
}

// A metric of a node at `host` (-1 if absent or the node does not answer).
double MetricAt(const std::string& host, int port, const std::string& name) {
  httplib::Client client(host, port);
  client.set_read_timeout(5, 0);
  auto res = client.Get("/metrics");
  if (!res || res->status != 200) return -1;
  return MetricValue(res->body, name);
}

class MessengerNetnsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const int id = getpid() % 100000;
    ns_ = fmt::format("pdmsg{}", id);
    // A subnet of its own per process, so that two runs at once do not share a route.
    prefill_ip_ = fmt::format("10.214.{}.1", id % 250);
    decode_ip_ = fmt::format("10.214.{}.2", id % 250);
    host_end_ = fmt::format("pdmh{}", id);
    const std::string& host_end = host_end_;
    const std::string ns_end = fmt::format("pdmn{}", id);
    if (IpBinary().empty()) GTEST_SKIP() << "SKIPPED: the cross-host test needs iproute2 (`ip`)";
    const std::vector<std::vector<std::string>> steps = {
        {"netns", "add", ns_},
        {"link", "add", host_end, "type", "veth", "peer", "name", ns_end},
        {"link", "set", ns_end, "netns", ns_},
        {"addr", "add", decode_ip_ + "/24", "dev", host_end},
        {"-n", ns_, "addr", "add", prefill_ip_ + "/24", "dev", ns_end},
        {"link", "set", host_end, "up"},
        {"-n", ns_, "link", "set", ns_end, "up"},
        {"-n", ns_, "link", "set", "lo", "up"},
    };
    for (const auto& step : steps) {
      if (RunIp(step) != 0) {
        std::string text;
        for (const auto& s : step) text += " " + s;
        GTEST_SKIP() << "SKIPPED: cannot create the network namespace: `ip" << text
                     << "` failed (needs root / CAP_NET_ADMIN)";
      }
    }
  }

  void TearDown() override {
    // Deleting the namespace destroys the veth end inside it, and with it the pair.
    if (!ns_.empty()) RunIp({"netns", "del", ns_});
  }

  // `pdserve serve --role prefill` inside the namespace on its veth address; false if it did
  // not get ready (the reason in *error).
  bool StartPrefill(std::string* error) {
    SubprocessOptions options;
    options.argv = {IpBinary(),
                    "netns",
                    "exec",
                    ns_,
                    BinaryPath("src/cli/pdserve"),
                    "serve",
                    "--listen",
                    prefill_ip_ + ":0",
                    "--model",
                    TinyModelDir()};
    auto args = PrefillArgs("tcp", {"--fabric-address", prefill_ip_});
    args.insert(args.end(), kFlags.begin(), kFlags.end());
    options.argv.insert(options.argv.end(), args.begin(), args.end());
    options.stdout_mode = StdStream::kPipe;
    auto process = Subprocess::Spawn(options);
    if (!process.ok()) {
      *error = process.status().ToString();
      return false;
    }
    prefill_ = std::move(*process);
    const std::string marker = "ready on http://" + prefill_ip_ + ":";
    const Deadline deadline = Deadline::AfterMs(60000);
    while (true) {
      auto line = prefill_->ReadLine(deadline);
      if (!line.ok()) break;
      if (const size_t at = line->find(marker); at != std::string::npos) {
        prefill_port_ = std::atoi(line->c_str() + at + marker.size());
        return prefill_port_ > 0;
      }
    }
    *error = "the prefill node in the namespace did not get ready";
    return false;
  }

  // A decode node on this side's veth address, pointed at the prefill node across it.
  std::vector<std::string> DecodeFlags() const {
    auto args = DecodeArgs("tcp", {},
                           {"--fabric-address", decode_ip_, "--prefill-peer",
                            fmt::format("{}:{}", prefill_ip_, prefill_port_)});
    args.insert(args.end(), kFlags.begin(), kFlags.end());
    return args;
  }

  std::string ns_, prefill_ip_, decode_ip_, host_end_;
  std::optional<Subprocess> prefill_;  // killed and reaped on destruction
  int prefill_port_ = 0;
};

TEST_F(MessengerNetnsTest, TcpAcrossNamespacesMatchesColocated) {
  std::string error;
  ASSERT_TRUE(StartPrefill(&error)) << error;
  NodeProcess decode(TinyModelDir(), DecodeFlags());
  NodeProcess colocated(TinyModelDir(), kFlags);
  ASSERT_TRUE(decode.ok()) << decode.error();
  ASSERT_TRUE(colocated.ok()) << colocated.error();
  ASSERT_EQ(WaitForMetric(decode.port(), "pdserve:messenger_peers_ready", 1, 30000), 1)
      << "no handshake across the namespaces";
  for (int length : {1, 2, 5, 37, 130}) {
    const std::vector<int32_t> prompt = RandomPrompt(length, 70 + length);
    const Completion want = Complete(colocated.port(), prompt, 6);
    const Completion got = Complete(decode.port(), prompt, 6);
    ASSERT_EQ(want.status, 200) << want.body.dump();
    ASSERT_EQ(got.status, 200) << "length " << length << ": " << got.body.dump();
    EXPECT_EQ(got.token_ids, want.token_ids) << "prompt length " << length;
  }
  ExpectNodeDrained(decode.port());
  EXPECT_EQ(MetricAt(prefill_ip_, prefill_port_, "pdserve:kv_cache_usage_perc"), 0);
  EXPECT_EQ(MetricAt(prefill_ip_, prefill_port_, "pdserve:messenger_requests_in_flight"), 0);
}

// The link between the hosts cut for 10 s and restored (a brief network partition): both nodes
// remove each other after the peer timeout (3 s), the decode node serves meanwhile by
// prefilling locally, and once the link is back it takes the prefill node back — the same
// process, as a new epoch — and the tokens stay the colocated node's.
TEST_F(MessengerNetnsTest, LinkCutAndRestoredThePrefillNodeIsUsedAgain) {
  std::string error;
  ASSERT_TRUE(StartPrefill(&error)) << error;
  NodeProcess decode(TinyModelDir(), DecodeFlags());
  NodeProcess colocated(TinyModelDir(), kFlags);
  ASSERT_TRUE(decode.ok()) << decode.error();
  ASSERT_TRUE(colocated.ok()) << colocated.error();
  ASSERT_EQ(WaitForMetric(decode.port(), "pdserve:messenger_peers_ready", 1, 30000), 1);
  const std::vector<int32_t> prompt = RandomPrompt(37, 90);
  const Completion want = Complete(colocated.port(), prompt, 6);
  ASSERT_EQ(want.status, 200) << want.body.dump();

  const auto cut_at = std::chrono::steady_clock::now();
  ASSERT_EQ(RunIp({"link", "set", host_end_, "down"}), 0);
  EXPECT_EQ(WaitForMetric(decode.port(), "pdserve:messenger_peers_ready", 0, 20000), 0);
  const Completion during = Complete(decode.port(), prompt, 6);  // prefilled locally
  ASSERT_EQ(during.status, 200) << during.body.dump();
  EXPECT_EQ(during.token_ids, want.token_ids);
  EXPECT_EQ(NodeMetric(decode.port(), "pdserve:decode_fallback_prefills_total"), 1);
  std::this_thread::sleep_until(cut_at + std::chrono::seconds(10));
  ASSERT_EQ(RunIp({"link", "set", host_end_, "up"}), 0);

  ASSERT_EQ(WaitForMetric(decode.port(), "pdserve:messenger_peers_ready", 1, 30000), 1)
      << "the prefill node was not taken back after the link came back";
  EXPECT_EQ(NodeMetric(decode.port(), "pdserve:messenger_peer_readmissions_total"), 1);
  EXPECT_EQ(MetricAt(prefill_ip_, prefill_port_, "pdserve:messenger_peer_readmissions_total"), 1);
  const double remote_before = NodeMetric(decode.port(), "pdserve:decode_remote_prefills_total");
  const Completion after = Complete(decode.port(), prompt, 6);
  ASSERT_EQ(after.status, 200) << after.body.dump();
  EXPECT_EQ(after.token_ids, want.token_ids);
  EXPECT_EQ(NodeMetric(decode.port(), "pdserve:decode_remote_prefills_total"), remote_before + 1);
  ExpectNodeDrained(decode.port());
  EXPECT_EQ(MetricAt(prefill_ip_, prefill_port_, "pdserve:kv_cache_usage_perc"), 0);
  EXPECT_EQ(MetricAt(prefill_ip_, prefill_port_, "pdserve:messenger_requests_in_flight"), 0);
}

}  // namespace
}  // namespace pdserve::testing
