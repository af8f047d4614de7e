// TransferEngine behaviour that needs no second process: argument validation, striping over
// domains, the unmatched-immediate handler, unknown senders, shutdown, and a taken shm endpoint
// name. Two engines in
// this process over shm.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <numeric>
#include <thread>

#include <gtest/gtest.h>

#include "fabric_test_util.h"

namespace pdserve::fabric::testing {
namespace {

template <typename Pred>
bool WaitUntil(Pred pred, int64_t ms = 20000) {
  Deadline deadline = Deadline::AfterMs(ms);
  while (!pred()) {
    if (deadline.Passed()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

struct Side {
  std::vector<std::byte> memory;  // declared first: outlives the engine that registered it
  std::unique_ptr<TransferEngine> engine;
  RegionId region = 0;
  MemoryDescriptor descriptor;
};

Side MakeSide(int domains, size_t bytes, TransferEngineHandlers handlers = {},
              Provider provider = Provider::kShm) {
  Side s;
  auto engine = TransferEngine::Create(TestConfig(provider, domains), std::move(handlers));
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  if (!engine.ok()) return s;
  s.engine = std::move(*engine);
  s.memory.resize(bytes);
  auto region = s.engine->RegisterMemory(s.memory.data(), s.memory.size());
  EXPECT_TRUE(region.ok());
  s.region = *region;
  s.descriptor = *s.engine->Describe(s.region);
  return s;
}

// A write of `pages` (the same page numbers on both sides, `bytes` apart and long) from `src`'s
// region to `dst`'s, which `src` knows as `peer`. The write refers to `pages`: keep it alive.
PagedWrite SamePagesWrite(const Side& src, PeerId peer, const Side& dst,
                          const std::vector<uint32_t>& pages, size_t bytes) {
  PagedWrite w;
  w.src_region = src.region;
  w.src_pages = pages;
  w.dst_pages = pages;
  w.peer = peer;
  w.dst = &dst.descriptor;
  w.length = w.src_stride = w.dst_stride = bytes;
  return w;
}

TEST(TransferEngineTest, RejectsBadArgumentsWithClearErrors) {
  FabricConfig bad = TestConfig(Provider::kShm, 0);
  EXPECT_EQ(TransferEngine::Create(bad).status().code(), StatusCode::kInvalidArgument);
  Side a = MakeSide(1, 4096);
  ASSERT_NE(a.engine, nullptr);
  EXPECT_EQ(a.engine->RegisterMemory(nullptr, 10).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a.engine->RegisterMemory(a.memory.data(), 10, MemoryKind::kDevice).status().code(),
            StatusCode::kUnimplemented);
  EXPECT_EQ(a.engine->Describe(999).status().code(), StatusCode::kNotFound);
  TransferEngineAddress tcp_address{Provider::kTcp, 5, {"x"}};
  EXPECT_EQ(a.engine->AddPeer(tcp_address).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a.engine->RemovePeer(42).code(), StatusCode::kNotFound);

  auto self = a.engine->AddPeer(a.engine->address());
  ASSERT_TRUE(self.ok());
  const std::vector<uint32_t> one = {0}, two = {0, 1}, far = {4};
  PagedWrite w = SamePagesWrite(a, *self, a, one, 1024);
  EXPECT_TRUE(a.engine->PostPagedWrite(w, Completion{}).ok());
  w.dst_pages = two;
  EXPECT_EQ(a.engine->PostPagedWrite(w, Completion{}).code(), StatusCode::kInvalidArgument);
  w.dst_pages = far;
  EXPECT_EQ(a.engine->PostPagedWrite(w, Completion{}).code(), StatusCode::kOutOfRange);
  w.dst_pages = one;
  w.src_pages = far;
  EXPECT_EQ(a.engine->PostPagedWrite(w, Completion{}).code(), StatusCode::kOutOfRange);
  w.src_pages = one;
  w.src_offset = ~0ull - 10;  // would overflow
  EXPECT_EQ(a.engine->PostPagedWrite(w, Completion{}).code(), StatusCode::kOutOfRange);
  w.src_offset = 0;
  w.src_region = 77;
  EXPECT_EQ(a.engine->PostPagedWrite(w, Completion{}).code(), StatusCode::kNotFound);
  w.src_region = a.region;
  w.peer = 99;
  EXPECT_EQ(a.engine->PostPagedWrite(w, Completion{}).code(), StatusCode::kNotFound);
  w.peer = *self;
  w.length = 0;
  EXPECT_EQ(a.engine->PostPagedWrite(w, Completion{}).code(), StatusCode::kInvalidArgument);
  std::vector<std::byte> big(a.engine->config().max_message_bytes + 1);
  EXPECT_EQ(a.engine->Send(*self, big, Completion{}).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(a.engine->Expect(1, 1, Deadline::AfterMs(100), nullptr).ok());
  EXPECT_EQ(a.engine->Expect(1, 1, Deadline::AfterMs(100), nullptr).code(),
            StatusCode::kAlreadyExists);
  EXPECT_TRUE(a.engine->RemoveExpectation(1));
}

TEST(TransferEngineTest, StripesPagesOverDomainsOfBothSides) {
  Side src = MakeSide(3, 64 * 1024);
  Side dst = MakeSide(2, 64 * 1024);
  ASSERT_NE(src.engine, nullptr);
  ASSERT_NE(dst.engine, nullptr);
  EXPECT_EQ(src.engine->num_domains(), 3);
  for (size_t i = 0; i < src.memory.size(); ++i) src.memory[i] = std::byte(i * 31 + 7);
  auto peer = src.engine->AddPeer(dst.engine->address());
  ASSERT_TRUE(peer.ok());
  ASSERT_TRUE(dst.engine->AddPeer(src.engine->address()).ok());
  std::vector<uint32_t> src_pages(13), dst_pages(13);
  std::iota(src_pages.begin(), src_pages.end(), 0);
  for (uint32_t i = 0; i < 13; ++i) dst_pages[i] = 14 - i;
  std::atomic<int> fired{0};
  ASSERT_TRUE(dst.engine
                  ->Expect(0x55, 13, Deadline::AfterMs(20000),
                           [&](const Status& s, uint32_t n) {
                             EXPECT_TRUE(s.ok());
                             EXPECT_EQ(n, 13u);
                             ++fired;
                           })
                  .ok());
  PagedWrite w;
  w.src_region = src.region;
  w.src_stride = 4096;
  w.src_pages = src_pages;
  w.peer = *peer;
  w.dst = &dst.descriptor;
  w.dst_stride = 4096;
  w.dst_pages = dst_pages;
  w.length = 4000;
  w.immediate = 0x55;
  TransferCounter counter;
  ASSERT_TRUE(src.engine->PostPagedWrite(w, Completion{nullptr, &counter}).ok());
  ASSERT_TRUE(counter.WaitFor(1, Deadline::AfterMs(20000)));
  EXPECT_EQ(counter.succeeded(), 1u);
  ASSERT_TRUE(WaitUntil([&] { return fired.load() == 1; }));
  for (size_t i = 0; i < 13; ++i) {
    EXPECT_EQ(std::memcmp(dst.memory.data() + dst_pages[i] * 4096,
                          src.memory.data() + src_pages[i] * 4096, 4000),
              0);
  }
}

// The engine's (one) endpoint name as text, without the NUL that shm's fi_getname includes.
std::string EndpointName(const Side& side) {
  std::string name = side.engine->address().endpoints.at(0);
  name.erase(std::find(name.begin(), name.end(), '\0'), name.end());
  return name;
}

// shm names an endpoint's region /dev/shm/PID:UID:N (N counts the process's endpoints) and
// refuses to enable an endpoint whose file exists while the pid in it is alive. That is what a
// process meets when it gets the pid of a SIGKILLed node whose file was never removed (it failed
// a CI run: "fi_enable failed: Device or resource busy"). Here the next name is taken by a link
// to this process's own live region, which libfabric cannot tell from such a file.
TEST(TransferEngineTest, ShmEndpointNameHeldByAStaleRegionIsPassedOver) {
  Side first = MakeSide(1, 64 * 1024);
  ASSERT_NE(first.engine, nullptr);
  const std::string name = EndpointName(first);
  const std::string prefix = "fi_shm://";
  ASSERT_EQ(name.rfind(prefix, 0), 0u) << name;
  const std::string file = name.substr(prefix.size());
  const size_t colon = file.rfind(':');
  ASSERT_NE(colon, std::string::npos) << file;
  const std::string taken =
      file.substr(0, colon + 1) + std::to_string(std::stoul(file.substr(colon + 1)) + 1);
  ASSERT_EQ(::link(("/dev/shm/" + file).c_str(), ("/dev/shm/" + taken).c_str()), 0)
      << "link /dev/shm/" << taken << ": " << std::strerror(errno);

  Side second = MakeSide(1, 64 * 1024);
  ASSERT_NE(second.engine, nullptr) << "the engine after a taken endpoint name did not open";
  const std::string second_name = EndpointName(second);
  EXPECT_NE(second_name, prefix + taken);
  ::unlink(("/dev/shm/" + taken).c_str());  // libfabric removed it already; in case it did not

  // The engine that passed over the name works: a page written to the first one arrives.
  for (size_t i = 0; i < 4096; ++i) second.memory[i] = std::byte(i * 13 + 1);
  auto peer = second.engine->AddPeer(first.engine->address());
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  const std::vector<uint32_t> page = {0};  // outlives the write, whose span points at it
  const PagedWrite w = SamePagesWrite(second, *peer, first, page, 4096);
  TransferCounter counter;
  ASSERT_TRUE(second.engine->PostPagedWrite(w, Completion{nullptr, &counter}).ok());
  ASSERT_TRUE(counter.WaitFor(1, Deadline::AfterMs(20000)));
  EXPECT_EQ(counter.succeeded(), 1u);
  EXPECT_EQ(std::memcmp(first.memory.data(), second.memory.data(), 4096), 0);
}

TEST(TransferEngineTest, UnmatchedImmediatesGoToHandlerWhichMayConsumeThem) {
  std::mutex mu;
  std::vector<uint32_t> seen;
  TransferEngineHandlers handlers;
  handlers.on_unmatched_immediate = [&](PeerId, uint32_t imm) {
    std::lock_guard lock(mu);
    seen.push_back(imm);
    return imm % 2 == 1;  // consume odd values, leave even ones for a later Expect
  };
  Side rx = MakeSide(1, 4096, std::move(handlers));
  Side tx = MakeSide(1, 4096);
  auto peer = tx.engine->AddPeer(rx.engine->address());
  ASSERT_TRUE(peer.ok());
  ASSERT_TRUE(rx.engine->AddPeer(tx.engine->address()).ok());
  TransferCounter counter;
  for (uint32_t imm : {1u, 2u, 2u, 3u}) {
    ASSERT_TRUE(
        tx.engine->PostImmediate(*peer, rx.descriptor, imm, Completion{nullptr, &counter}).ok());
  }
  ASSERT_TRUE(counter.WaitFor(4, Deadline::AfterMs(20000)));
  ASSERT_TRUE(WaitUntil([&] {
    std::lock_guard lock(mu);
    return seen.size() == 4;
  }));
  // The handler runs first and an unconsumed immediate is remembered after it returns, so the
  // count can trail `seen` by a moment.
  ASSERT_TRUE(WaitUntil([&] { return rx.engine->EarlyArrivals(2) == 2u; }))
      << "early arrivals of 2: " << rx.engine->EarlyArrivals(2);
  EXPECT_EQ(rx.engine->EarlyArrivals(1), 0u);
  EXPECT_EQ(rx.engine->EarlyArrivals(3), 0u);
  std::atomic<int> fired{0};
  ASSERT_TRUE(rx.engine
                  ->Expect(2, 2, Deadline::AfterMs(20000),
                           [&](const Status& s, uint32_t) {
                             EXPECT_TRUE(s.ok());
                             ++fired;
                           })
                  .ok());
  ASSERT_TRUE(WaitUntil([&] { return fired.load() == 1; }));
}

// The handshake case: the receiver learns the sender from its first message. Over tcp too,
// where rxm must deliver a message from an address missing in the AV.
class UnknownSenderTest : public ::testing::TestWithParam<Provider> {};

TEST_P(UnknownSenderTest, MessageCarriesSenderInstance) {
  std::mutex mu;
  std::vector<std::pair<PeerId, uint64_t>> got;
  TransferEngineHandlers handlers;
  handlers.on_message = [&](PeerId from, uint64_t instance, std::span<const std::byte>) {
    std::lock_guard lock(mu);
    got.emplace_back(from, instance);
  };
  Side rx = MakeSide(1, 4096, std::move(handlers), GetParam());
  Side tx = MakeSide(1, 4096, {}, GetParam());
  auto peer = tx.engine->AddPeer(rx.engine->address());
  ASSERT_TRUE(peer.ok());
  const char text[] = "handshake";
  ASSERT_TRUE(tx.engine->Send(*peer, std::as_bytes(std::span(text)), Completion{}).ok());
  ASSERT_TRUE(WaitUntil([&] {
    std::lock_guard lock(mu);
    return !got.empty();
  }));
  std::lock_guard lock(mu);
  EXPECT_EQ(got[0].first, kUnknownPeer);
  EXPECT_EQ(got[0].second, tx.engine->address().instance);
}

INSTANTIATE_TEST_SUITE_P(Providers, UnknownSenderTest,
                         ::testing::Values(Provider::kShm, Provider::kTcp), ProviderParamName);

TEST(TransferEngineTest, ShutdownCancelsExpectationsAndRemovePeerFromCallbackIsRefused) {
  Side a = MakeSide(1, 4096);
  auto self = a.engine->AddPeer(a.engine->address());
  ASSERT_TRUE(self.ok());
  Status from_callback;
  TransferCounter counter;
  TransferEngine* engine = a.engine.get();
  const PeerId id = *self;
  ASSERT_TRUE(
      a.engine
          ->PostImmediate(
              id, a.descriptor, 5,
              Completion{[&](const Status&) { from_callback = engine->RemovePeer(id); }, &counter})
          .ok());
  ASSERT_TRUE(counter.WaitFor(1, Deadline::AfterMs(20000)));
  EXPECT_EQ(from_callback.code(), StatusCode::kFailedPrecondition);
  std::atomic<int> cancelled{0};
  ASSERT_TRUE(a.engine
                  ->Expect(77, 3, Deadline::AfterMs(60000),
                           [&](const Status& s, uint32_t) {
                             if (s.code() == StatusCode::kCancelled) ++cancelled;
                           })
                  .ok());
  a.engine.reset();
  EXPECT_EQ(cancelled.load(), 1);
}

}  // namespace
}  // namespace pdserve::fabric::testing
