// RawWriteProbe, the raw-bandwidth ceiling of `pdserve bench fabric`: writes land byte for byte
// in the peer's buffer and the peer counts one remote completion per write.
#include "fabric/raw_write_probe.h"

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace pdserve::fabric {
namespace {

TEST(RawWriteProbeTest, PagedWritesLandAndAreCountedOverShm) {
  constexpr size_t kPage = 8192;
  constexpr uint32_t kPages = 8;
  constexpr uint64_t kWrites = 40;  // wraps around the pages: page i % kPages
  std::vector<std::byte> src(kPage * kPages), dst(kPage * kPages, std::byte{0});
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 131 + 17);
  auto sender = RawWriteProbe::Open(Provider::kShm, src.data(), src.size());
  auto receiver = RawWriteProbe::Open(Provider::kShm, dst.data(), dst.size());
  if (!sender.ok() || !receiver.ok()) {
    GTEST_SKIP() << "libfabric shm provider unavailable here: " << sender.status().ToString()
                 << " / " << receiver.status().ToString();
  }
  const RawWriteProbe::Target target = (*receiver)->target();
  EXPECT_FALSE(target.endpoint.empty());
  auto peer = (*sender)->AddPeer(target.endpoint);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();

  // Progress is manual: the receiver polls from its own thread while the sender writes.
  std::atomic<bool> polling{true};
  std::atomic<uint64_t> arrivals{0};
  std::thread poller([&] {
    while (polling.load()) arrivals += (*receiver)->PollRemote();
  });
  const Status written = (*sender)->WriteLoop(*peer, target, kPage, kPages, kWrites,
                                              /*window=*/4, /*imm=*/7, Deadline::AfterMs(30000));
  const Deadline deadline = Deadline::AfterMs(30000);
  while (arrivals.load() < kWrites && !deadline.Passed()) std::this_thread::yield();
  polling = false;
  poller.join();
  ASSERT_TRUE(written.ok()) << written.ToString();
  EXPECT_EQ(arrivals.load(), kWrites);
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), src.size()), 0);
}

TEST(RawWriteProbeTest, EmptyPeerNameIsAnError) {
  std::vector<std::byte> buffer(4096);
  auto probe = RawWriteProbe::Open(Provider::kShm, buffer.data(), buffer.size());
  if (!probe.ok())
    GTEST_SKIP() << "libfabric shm provider unavailable: " << probe.status().ToString();
  EXPECT_FALSE((*probe)->AddPeer("").ok());
}

}  // namespace
}  // namespace pdserve::fabric
