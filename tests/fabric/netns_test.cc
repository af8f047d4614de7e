// The cross-host path: two fabric_test_peer processes in two network namespaces joined by a
// veth pair talk tcp (ofi_rxm) over it. The test creates and removes the namespaces itself;
// if it cannot (not root, no CAP_NET_ADMIN, no `ip`), it FAILS with a clear message.
#include <unistd.h>

#include <cstring>
#include <random>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/subprocess.h"
#include "fabric_test_util.h"

namespace pdserve::fabric::testing {
namespace {

std::string IpBinary() {
  for (const char* path : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (access(path, X_OK) == 0) return path;
  }
  return "";
}

// Runs `ip <args>`; returns its exit status (127 if it could not run).
int RunIp(const std::vector<std::string>& args) {
  const std::string ip = IpBinary();
  if (ip.empty()) return 127;
  SubprocessOptions options;
  options.argv = {ip};
  options.argv.insert(options.argv.end(), args.begin(), args.end());
  auto process = Subprocess::Spawn(options);
  if (!process.ok()) return 127;
  auto status = process->WaitFor(Deadline::AfterMs(30000));
  if (!status.ok()) return 127;
  return status->exited() ? status->code : 128;
}

class NetnsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const int id = getpid() % 100000;
    ns_a_ = fmt::format("pdfab{}a", id);
    ns_b_ = fmt::format("pdfab{}b", id);
    const std::string veth_a = fmt::format("pdfa{}", id), veth_b = fmt::format("pdfb{}", id);
    ASSERT_FALSE(IpBinary().empty()) << "network-namespace test needs the `ip` tool (iproute2)";
    const std::vector<std::vector<std::string>> steps = {
        {"netns", "add", ns_a_},
        {"netns", "add", ns_b_},
        {"link", "add", veth_a, "type", "veth", "peer", "name", veth_b},
        {"link", "set", veth_a, "netns", ns_a_},
        {"link", "set", veth_b, "netns", ns_b_},
        {"-n", ns_a_, "addr", "add", "10.213.0.1/24", "dev", veth_a},
        {"-n", ns_b_, "addr", "add", "10.213.0.2/24", "dev", veth_b},
        {"-n", ns_a_, "link", "set", veth_a, "up"},
        {"-n", ns_b_, "link", "set", veth_b, "up"},
        {"-n", ns_a_, "link", "set", "lo", "up"},
        {"-n", ns_b_, "link", "set", "lo", "up"},
    };
    for (const auto& step : steps) {
      std::string text;
      for (const auto& s : step) text += " " + s;
      ASSERT_EQ(RunIp(step), 0) << "could not set up network namespaces: `ip" << text
                                << "` failed (this test needs root / CAP_NET_ADMIN)";
    }
  }

  void TearDown() override {
    // Deleting a namespace destroys the veth end inside it, and with it the pair.
    RunIp({"netns", "del", ns_a_});
    RunIp({"netns", "del", ns_b_});
  }

  std::string ns_a_, ns_b_;
};

TEST_F(NetnsTest, TcpPagedWritesAcrossNamespaces) {
  constexpr uint64_t kPage = 8192, kStride = 10000;
  constexpr uint32_t kPages = 64;
  SharedFile receiver_file(kPages * kStride), sender_file(kPages * kStride);
  ASSERT_NE(receiver_file.data(), nullptr);
  ASSERT_NE(sender_file.data(), nullptr);
  std::mt19937_64 rng(99);
  for (size_t i = 0; i < sender_file.size(); ++i) sender_file.data()[i] = std::byte(rng());

  PeerProcess receiver, sender;
  ASSERT_TRUE(receiver.Start({IpBinary(), "netns", "exec", ns_a_, PeerBinary()}).ok());
  ASSERT_TRUE(sender.Start({IpBinary(), "netns", "exec", ns_b_, PeerBinary()}).ok());
  auto a = InitPeer(receiver, Provider::kTcp, 1, "10.213.0.1", receiver_file);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = InitPeer(sender, Provider::kTcp, 1, "10.213.0.2", sender_file);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_TRUE(
      receiver.Command("peer " + HexEncode(b->address.Serialize()), Deadline::AfterMs(10000)).ok());
  auto id = sender.Command("peer " + HexEncode(a->address.Serialize()), Deadline::AfterMs(10000));
  ASSERT_TRUE(id.ok()) << id.status().ToString();

  std::vector<uint32_t> src, dst;
  for (uint32_t i = 0; i < 40; ++i) {
    src.push_back((i * 7) % kPages);
    dst.push_back((i * 13 + 5) % kPages);
  }
  ASSERT_TRUE(receiver.Command("expect 4660 40 20000", Deadline::AfterMs(5000)).ok());
  ASSERT_TRUE(sender
                  .Command(fmt::format("write {} {} {} 4660 0 {} 0 {} {} {} 1 20000", *id,
                                       HexEncode(a->descriptor.Serialize()), kPage, kStride,
                                       kStride, Csv(src), Csv(dst)),
                           Deadline::AfterMs(5000))
                  .ok());
  auto written = sender.WaitEvent("written ", Deadline::AfterMs(30000));
  ASSERT_TRUE(written.ok()) << written.status().ToString();
  EXPECT_EQ(*written, "1 0");
  auto fired = receiver.WaitEvent("fired 4660 ", Deadline::AfterMs(30000));
  ASSERT_TRUE(fired.ok()) << fired.status().ToString();
  EXPECT_EQ(*fired, "OK 40");
  for (size_t i = 0; i < src.size(); ++i) {
    EXPECT_EQ(std::memcmp(receiver_file.data() + dst[i] * kStride,
                          sender_file.data() + src[i] * kStride, kPage),
              0)
        << "page " << i;
  }
}

}  // namespace
}  // namespace pdserve::fabric::testing
