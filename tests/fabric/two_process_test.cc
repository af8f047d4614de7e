// Transfers between this process and a real second process (fabric_test_peer) over shm and
// over tcp on loopback: paged writes with random data, random non-contiguous page lists and
// strides larger than the page, every byte checked, immediate counts exact.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "fabric_test_util.h"

namespace pdserve::fabric::testing {
namespace {

constexpr uint64_t kPageBytes = 3000;  // deliberately not a power of two
constexpr uint64_t kSrcStride = 3500;
constexpr uint64_t kDstStride = 4608;
constexpr uint64_t kDstOffset = 100;
constexpr uint32_t kSrcPages = 160;
constexpr uint32_t kDstPages = 200;

class TwoProcessTest : public ::testing::TestWithParam<Provider> {
 protected:
  void SetUp() override {
    ASSERT_NE(receiver_file_.data(), nullptr);
    ASSERT_TRUE(peer_.Start({PeerBinary()}).ok());
    auto started = InitPeer(peer_, GetParam(), 2, node(), receiver_file_);
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    remote_ = *started;
    TransferEngineHandlers handlers;
    handlers.on_message = [this](PeerId from, uint64_t, std::span<const std::byte> payload) {
      std::lock_guard lock(mu_);
      messages_.emplace_back(
          from, std::string(reinterpret_cast<const char*>(payload.data()), payload.size()));
    };
    auto engine = TransferEngine::Create(TestConfig(GetParam(), 2), std::move(handlers));
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    engine_ = std::move(*engine);
    auto peer = engine_->AddPeer(remote_.address);
    ASSERT_TRUE(peer.ok()) << peer.status().ToString();
    peer_id_ = *peer;
    auto back = peer_.Command("peer " + HexEncode(engine_->address().Serialize()),
                              Deadline::AfterMs(10000));
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    source_.resize(kSrcPages * kSrcStride);
    std::mt19937_64 rng(20240611);
    for (auto& b : source_) b = static_cast<std::byte>(rng());
    auto region = engine_->RegisterMemory(source_.data(), source_.size());
    ASSERT_TRUE(region.ok()) << region.status().ToString();
    region_ = *region;
  }

  std::string node() const { return GetParam() == Provider::kTcp ? "127.0.0.1" : ""; }

  Status Write(const std::vector<uint32_t>& src, const std::vector<uint32_t>& dst,
               std::optional<uint32_t> imm) {
    PagedWrite w;
    w.src_region = region_;
    w.src_stride = kSrcStride;
    w.src_pages = src;
    w.peer = peer_id_;
    w.dst = &remote_.descriptor;
    w.dst_offset = kDstOffset;
    w.dst_stride = kDstStride;
    w.dst_pages = dst;
    w.length = kPageBytes;
    w.immediate = imm;
    TransferCounter counter;
    PD_RETURN_IF_ERROR(engine_->PostPagedWrite(w, Completion{nullptr, &counter}));
    if (!counter.WaitFor(1, Deadline::AfterMs(20000))) {
      return Status::DeadlineExceeded("paged write did not complete");
    }
    return counter.first_error();
  }

  // Polls the peer until it has remembered `n` early arrivals of `imm`.
  void WaitEarly(uint32_t imm, uint32_t n) {
    Deadline deadline = Deadline::AfterMs(10000);
    while (!deadline.Passed()) {
      auto got = peer_.Command("early " + std::to_string(imm), deadline);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      if (std::stoul(*got) == n) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    FAIL() << "peer never saw " << n << " early arrivals of " << imm;
  }

  // The parts of the end-to-end test (one test per provider: process start-up dominates).
  void CheckPagedWrites();
  void CheckSingleAndImmediateOnlyWrites();
  void CheckMessagesBothWays();

  SharedFile receiver_file_{kDstOffset + kDstPages * kDstStride};
  PeerProcess peer_;
  StartedPeer remote_;
  std::vector<std::byte> source_;  // outlives engine_ (registered memory)
  std::unique_ptr<TransferEngine> engine_;
  PeerId peer_id_ = 0;
  RegionId region_ = 0;
  std::mutex mu_;
  std::vector<std::pair<PeerId, std::string>> messages_;  // guarded by mu_
};

void TwoProcessTest::CheckPagedWrites() {
  std::mt19937 rng(7);
  std::vector<uint32_t> dst(kDstPages);
  std::iota(dst.begin(), dst.end(), 0);
  std::shuffle(dst.begin(), dst.end(), rng);
  dst.resize(96);  // random, non-contiguous, unordered destination pages
  std::vector<uint32_t> src(kSrcPages);
  std::iota(src.begin(), src.end(), 0);
  std::shuffle(src.begin(), src.end(), rng);
  src.resize(dst.size());
  const uint32_t imm = 0xA1;

  // First part lands before anyone expects it...
  std::vector<uint32_t> src_a(src.begin(), src.begin() + 40), dst_a(dst.begin(), dst.begin() + 40);
  std::vector<uint32_t> src_b(src.begin() + 40, src.end()), dst_b(dst.begin() + 40, dst.end());
  ASSERT_TRUE(Write(src_a, dst_a, imm).ok());
  WaitEarly(imm, 40);
  // ...and still counts once the expectation is registered.
  ASSERT_TRUE(
      peer_.Command("expect " + std::to_string(imm) + " 96 20000", Deadline::AfterMs(5000)).ok());
  ASSERT_TRUE(Write(src_b, dst_b, imm).ok());
  auto fired = peer_.WaitEvent("fired " + std::to_string(imm) + " ", Deadline::AfterMs(20000));
  ASSERT_TRUE(fired.ok()) << fired.status().ToString();
  EXPECT_EQ(*fired, "OK 96");
  // Exactly 96: nothing left over for a further expectation.
  ASSERT_TRUE(
      peer_.Command("expect " + std::to_string(imm) + " 1 300", Deadline::AfterMs(5000)).ok());
  fired = peer_.WaitEvent("fired " + std::to_string(imm) + " ", Deadline::AfterMs(10000));
  ASSERT_TRUE(fired.ok());
  EXPECT_EQ(*fired, "DEADLINE_EXCEEDED 0");

  // Every byte: written pages equal their source pages, everything else is still zero.
  std::vector<std::byte> expected(receiver_file_.size(), std::byte{0});
  for (size_t i = 0; i < dst.size(); ++i) {
    std::memcpy(expected.data() + kDstOffset + dst[i] * kDstStride,
                source_.data() + src[i] * kSrcStride, kPageBytes);
  }
  size_t mismatches = 0;
  for (size_t i = 0; i < expected.size(); ++i)
    mismatches += expected[i] != receiver_file_.data()[i];
  EXPECT_EQ(mismatches, 0u);
}

void TwoProcessTest::CheckSingleAndImmediateOnlyWrites() {
  SingleWrite w;
  w.src_region = region_;
  w.src_offset = 5;
  w.peer = peer_id_;
  w.dst = &remote_.descriptor;
  w.dst_offset = 11;
  w.length = 77;
  TransferCounter counter;
  ASSERT_TRUE(engine_->PostWrite(w, Completion{nullptr, &counter}).ok());
  w.immediate = 0xB2;
  w.dst_offset = 1000;
  ASSERT_TRUE(engine_->PostWrite(w, Completion{nullptr, &counter}).ok());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(
        engine_->PostImmediate(peer_id_, remote_.descriptor, 0xB2, Completion{nullptr, &counter})
            .ok());
  }
  ASSERT_TRUE(counter.WaitFor(5, Deadline::AfterMs(20000)));
  EXPECT_EQ(counter.succeeded(), 5u) << counter.first_error().ToString();
  ASSERT_TRUE(peer_.Command("expect 178 4 20000", Deadline::AfterMs(5000)).ok());
  auto fired = peer_.WaitEvent("fired 178 ", Deadline::AfterMs(20000));
  ASSERT_TRUE(fired.ok());
  EXPECT_EQ(*fired, "OK 4");
  EXPECT_EQ(std::memcmp(receiver_file_.data() + 11, source_.data() + 5, 77), 0);
  EXPECT_EQ(std::memcmp(receiver_file_.data() + 1000, source_.data() + 5, 77), 0);
  EXPECT_EQ(receiver_file_.data()[10], std::byte{0});
  EXPECT_EQ(receiver_file_.data()[88], std::byte{0});
}

void TwoProcessTest::CheckMessagesBothWays() {
  const std::string hello = "hello-from-test";
  TransferCounter counter;
  ASSERT_TRUE(engine_
                  ->Send(peer_id_, std::as_bytes(std::span(hello.data(), hello.size())),
                         Completion{nullptr, &counter})
                  .ok());
  auto got = peer_.WaitEvent("msg ", Deadline::AfterMs(20000));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "1 " + hello);  // the peer added us first, as its peer 1
  ASSERT_TRUE(counter.WaitFor(1, Deadline::AfterMs(20000)));
  EXPECT_EQ(counter.succeeded(), 1u);
  // Many messages back: more than the receive-buffer pool, so buffers must be re-posted.
  for (int i = 0; i < 80; ++i) {
    ASSERT_TRUE(peer_.Command("send 1 reply" + std::to_string(i), Deadline::AfterMs(5000)).ok());
  }
  Deadline deadline = Deadline::AfterMs(20000);
  while (!deadline.Passed()) {
    {
      std::lock_guard lock(mu_);
      if (messages_.size() >= 80) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::lock_guard lock(mu_);
  ASSERT_EQ(messages_.size(), 80u);
  std::vector<std::string> texts;
  for (auto& [from, text] : messages_) {
    EXPECT_EQ(from, peer_id_);
    texts.push_back(text);
  }
  std::sort(texts.begin(), texts.end());
  EXPECT_TRUE(std::adjacent_find(texts.begin(), texts.end()) == texts.end());
  EXPECT_TRUE(std::find(texts.begin(), texts.end(), "reply79") != texts.end());
}

// Paged writes first: they check every byte of the receiver's memory, which the single
// writes then change.
TEST_P(TwoProcessTest, EndToEnd) {
  {
    SCOPED_TRACE("paged writes");
    ASSERT_NO_FATAL_FAILURE(CheckPagedWrites());
  }
  {
    SCOPED_TRACE("single and immediate-only writes");
    ASSERT_NO_FATAL_FAILURE(CheckSingleAndImmediateOnlyWrites());
  }
  SCOPED_TRACE("messages");
  CheckMessagesBothWays();
}

INSTANTIATE_TEST_SUITE_P(Providers, TwoProcessTest,
                         ::testing::Values(Provider::kShm, Provider::kTcp), ProviderParamName);

}  // namespace
}  // namespace pdserve::fabric::testing
