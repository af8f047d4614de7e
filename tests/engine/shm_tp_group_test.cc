#include "engine/shm_tp_group.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace pdserve {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr uint64_t kFingerprint = 0x1234'5678'9abc'def0;

// The leader's group and its workers' (attached through a dup of the leader's fd).
std::vector<std::unique_ptr<ShmTpGroup>> MakeGroup(const ShmTpGroupOptions& options) {
  std::vector<std::unique_ptr<ShmTpGroup>> ranks;
  auto leader = ShmTpGroup::Create(options);
  EXPECT_TRUE(leader.ok()) << leader.status().ToString();
  if (!leader.ok()) return ranks;
  ranks.push_back(std::move(*leader));
  for (int r = 1; r < options.size; ++r) {
    auto worker = ShmTpGroup::Attach(dup(ranks[0]->fd()), r, options.deadline);
    EXPECT_TRUE(worker.ok()) << worker.status().ToString();
    if (!worker.ok()) return {};
    ranks.push_back(std::move(*worker));
  }
  return ranks;
}

// The shape of gather number `call` and the columns each rank computes: uneven, sometimes
// empty, the same on every rank. Rows 0 sometimes; often more than the gather buffer holds.
struct Shape {
  int rows = 0;
  int width = 0;
  std::vector<int> cuts;  // rank r owns [cuts[r], cuts[r + 1])
};

Shape ShapeOf(int call, int size) {
  Shape s;
  s.rows = (call * 7) % 23;  // 0..22
  s.width = 1 + (call * 13) % 61;
  s.cuts.push_back(0);
  for (int r = 1; r < size; ++r) {
    s.cuts.push_back(std::max(s.cuts.back(), (call * 31 + r * 17) % (s.width + 1)));
  }
  s.cuts.push_back(s.width);
  return s;
}

// Exact in float: below 2^24.
float ValueAt(int call, int row, int col) {
  return static_cast<float>((call * 1009 + row * 101 + col * 7) % 1000003);
}

// Runs `calls` gathers as `rank`; returns the number of wrong elements (or -1 on an error).
int64_t RunGathers(ShmTpGroup& group, int calls) {
  int64_t wrong = 0;
  for (int call = 0; call < calls; ++call) {
    const Shape s = ShapeOf(call, group.size());
    const int begin = s.cuts[group.rank()], end = s.cuts[group.rank() + 1];
    std::vector<float> m(static_cast<size_t>(s.rows) * s.width, -1.0f);
    for (int row = 0; row < s.rows; ++row) {
      for (int col = begin; col < end; ++col) m[row * s.width + col] = ValueAt(call, row, col);
    }
    Status st = group.AllGatherColumns(m.data(), s.rows, s.width, begin, end);
    if (!st.ok()) {
      ADD_FAILURE() << "rank " << group.rank() << " call " << call << ": " << st.ToString();
      return -1;
    }
    for (int row = 0; row < s.rows; ++row) {
      for (int col = 0; col < s.width; ++col)
        wrong += m[row * s.width + col] != ValueAt(call, row, col);
    }
  }
  return wrong;
}

void GatherOnThreads(int size) {
  ShmTpGroupOptions options;
  options.size = size;
  options.gather_bytes = 1024;  // 256 floats: most shapes go in several row blocks
  options.mailbox_bytes = 64;
  auto ranks = MakeGroup(options);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(size));
  constexpr int kCalls = 300;
  // The row-block split is exercised: some shape needs more than one block.
  bool split = false;
  for (int call = 0; call < kCalls; ++call) {
    const Shape s = ShapeOf(call, size);
    split |= static_cast<size_t>(s.rows) * s.width * sizeof(float) > options.gather_bytes;
  }
  ASSERT_TRUE(split);
  std::vector<int64_t> wrong(size, -2);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] { wrong[r] = RunGathers(*ranks[r], kCalls); });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < size; ++r) EXPECT_EQ(wrong[r], 0) << "rank " << r;
  EXPECT_FALSE(ranks[0]->failed());
}

TEST(ShmTpGroupTest, GathersEveryColumnOnTwoThreads) { GatherOnThreads(2); }
TEST(ShmTpGroupTest, GathersEveryColumnOnThreeThreads) { GatherOnThreads(3); }

TEST(ShmTpGroupTest, SingleRankGatherIsIdentity) {
  ShmTpGroupOptions options;
  options.size = 1;
  auto ranks = MakeGroup(options);
  ASSERT_EQ(ranks.size(), 1u);
  std::vector<float> m = {1, 2, 3, 4, 5, 6};
  ASSERT_TRUE(ranks[0]->AllGatherColumns(m.data(), 2, 3, 0, 3).ok());
  EXPECT_EQ(m, (std::vector<float>{1, 2, 3, 4, 5, 6}));
}

// A summary of a message that fits exactly in floats: its size and a byte checksum.
std::pair<float, float> Summary(const std::string& m) {
  uint32_t sum = 0;
  for (unsigned char ch : m) sum = (sum * 31 + ch) % 65521;
  return {static_cast<float>(m.size()), static_cast<float>(sum)};
}

// The forked worker: gathers, then answers each message with its summary through a gather.
// Returns the exit code (0: shut down cleanly).
int WorkerProcess(int fd, int gathers) {
  auto group = ShmTpGroup::Attach(fd, 1, seconds(60));
  if (!group.ok()) return 10;
  if (!(*group)->MarkReady(kFingerprint).ok()) return 11;
  if (RunGathers(**group, gathers) != 0) return 12;
  for (;;) {
    Result<std::string> message = (*group)->Receive();
    if (!message.ok()) return message.status().code() == StatusCode::kCancelled ? 0 : 13;
    auto [size, sum] = Summary(*message);
    float row[4] = {0, 0, size, sum};
    if (!(*group)->AllGatherColumns(row, 1, 4, 2, 4).ok()) return 14;
  }
}

// Reaps a forked worker on a thread, as the node's supervisor will. A worker that ends before
// Finish() fails `group` (if given) at once, so the leader's waits end instead of running to the
// deadline. Destroying the watch kills a worker still running.
class ChildWatch {
 public:
  ChildWatch(pid_t pid, ShmTpGroup* group) : pid_(pid), thread_([this, group] { Watch(group); }) {}
  ~ChildWatch() {
    ExpectExit(Duration::zero());
    Join();
  }

  // From now on the worker may end (it is killed after `limit`) without failing the group.
  void ExpectExit(Duration limit) {
    finish_at_ns_ = (Clock::now() + limit).time_since_epoch().count();
    finishing_ = true;
  }
  // Waits for the worker's end (call ExpectExit first). Returns its wait status; -1 if it had
  // to be killed here.
  int Join() {
    if (thread_.joinable()) thread_.join();
    return status_;
  }

 private:
  void Watch(ShmTpGroup* group) {
    for (;;) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        status_ = status;
        if (!finishing_ && group != nullptr) {
          group->Fail("rank 1 (pid " + std::to_string(pid_) + ") ended, wait status " +
                      std::to_string(status));
        }
        return;
      }
      if (finishing_ && Clock::now().time_since_epoch().count() > finish_at_ns_) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        return;
      }
      std::this_thread::sleep_for(milliseconds(5));
    }
  }

  const pid_t pid_;
  std::atomic<bool> finishing_{false};
  std::atomic<int64_t> finish_at_ns_{0};
  int status_ = -1;     // written by the thread before it ends
  std::thread thread_;  // last: it uses the members above
};

TEST(ShmTpGroupTest, ForkedWorkerGathersAndReceivesUntilShutdown) {
  ShmTpGroupOptions options;
  options.gather_bytes = 512;
  options.mailbox_bytes = 4096;
  options.deadline = seconds(60);
  auto leader = ShmTpGroup::Create(options);
  ASSERT_TRUE(leader.ok()) << leader.status().ToString();
  constexpr int kGathers = 100;
  // No OpenMP in this test, so fork without exec is safe; the child inherits the fd.
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) _exit(WorkerProcess((*leader)->fd(), kGathers));
  ShmTpGroup& group = **leader;
  ChildWatch watch(pid, &group);
  ASSERT_TRUE(group.WaitReady(Deadline::After(seconds(60)), kFingerprint).ok());
  EXPECT_EQ(RunGathers(group, kGathers), 0);
  const std::vector<std::string> messages = {"step 1", std::string(1000, 'x'), "",
                                             std::string(4096, 'y'), "step 5"};
  for (size_t i = 0; i < messages.size(); ++i) {
    ASSERT_TRUE(group.Publish(messages[i]).ok()) << i;
    float row[4] = {static_cast<float>(i), 0, -1, -1};
    ASSERT_TRUE(group.AllGatherColumns(row, 1, 4, 0, 2).ok()) << i;
    auto [size, sum] = Summary(messages[i]);
    EXPECT_EQ(row[2], size) << "message " << i;
    EXPECT_EQ(row[3], sum) << "message " << i;
  }
  watch.ExpectExit(seconds(60));
  group.Shutdown();
  const int status = watch.Join();
  ASSERT_TRUE(WIFEXITED(status)) << "child wait status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_FALSE(group.failed());
}

TEST(ShmTpGroupTest, MissingRankFailsTheGroupAtTheDeadline) {
  ShmTpGroupOptions options;
  options.deadline = milliseconds(300);
  auto ranks = MakeGroup(options);
  ASSERT_EQ(ranks.size(), 2u);
  float m[2] = {1, 2};
  const TimePoint start = Clock::now();
  Status st = ranks[0]->AllGatherColumns(m, 1, 2, 0, 1);  // rank 1 never comes
  const double waited = SecondsSince(start);
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.ToString();
  EXPECT_NE(st.message().find("for rank 1 (pid"), std::string::npos) << st.message();
  EXPECT_GE(waited, 0.29);
  EXPECT_LT(waited, 5.0);
  EXPECT_TRUE(ranks[0]->failed());
  EXPECT_TRUE(ranks[1]->failed());
  // Every later call of every rank fails at once, with the reason.
  Status later = ranks[1]->AllGatherColumns(m, 1, 2, 1, 2);
  EXPECT_EQ(later.code(), StatusCode::kUnavailable);
  EXPECT_NE(later.message().find(st.message()), std::string::npos) << later.message();
  EXPECT_EQ(ranks[0]->Publish("x").code(), StatusCode::kUnavailable);
}

TEST(ShmTpGroupTest, FailWakesRanksInACollectiveAndInReceive) {
  ShmTpGroupOptions options;
  options.size = 3;
  options.deadline = seconds(60);
  auto ranks = MakeGroup(options);
  ASSERT_EQ(ranks.size(), 3u);
  std::optional<Status> gathered;
  std::optional<Result<std::string>> received;
  std::atomic<int64_t> gathered_at{0}, received_at{0};
  auto now_ns = [] { return Clock::now().time_since_epoch().count(); };
  std::thread gatherer([&] {
    float m[3] = {0, 0, 0};
    gathered = ranks[1]->AllGatherColumns(m, 1, 3, 1, 2);  // ranks 0 and 2 never come
    gathered_at = now_ns();
  });
  std::thread receiver([&] {
    received = ranks[2]->Receive();  // nothing is published
    received_at = now_ns();
  });
  std::this_thread::sleep_for(milliseconds(200));  // both are asleep by now (or see the flag)
  EXPECT_TRUE(ranks[0]->FailedStatus().ok());
  const int64_t failed_at = now_ns();
  ranks[0]->Fail("rank 9 (pid 42) killed by signal 9");
  gatherer.join();
  receiver.join();
  ASSERT_TRUE(gathered.has_value() && received.has_value());
  EXPECT_EQ(gathered->code(), StatusCode::kUnavailable);
  EXPECT_NE(gathered->message().find("killed by signal 9"), std::string::npos);
  EXPECT_EQ(received->status().code(), StatusCode::kUnavailable);
  EXPECT_NE(received->status().message().find("killed by signal 9"), std::string::npos);
  EXPECT_LT((gathered_at - failed_at) / 1e9, 1.0);
  EXPECT_LT((received_at - failed_at) / 1e9, 1.0);
  // A later Fail keeps the first reason, which every rank reads (what a watcher reports).
  ranks[1]->Fail("second");
  EXPECT_EQ(ranks[2]->AllGatherColumns(nullptr, 0, 0, 0, 0).message(), gathered->message());
  for (const auto& rank : ranks) EXPECT_EQ(rank->FailedStatus(), *gathered);
}

TEST(ShmTpGroupTest, KilledWorkerProcessEndsTheLeadersWaitByTheDeadline) {
  ShmTpGroupOptions options;
  options.deadline = milliseconds(500);
  auto leader = ShmTpGroup::Create(options);
  ASSERT_TRUE(leader.ok());
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto group = ShmTpGroup::Attach((*leader)->fd(), 1, seconds(60));
    if (!group.ok() || !(*group)->MarkReady(kFingerprint).ok()) _exit(1);
    pause();  // until killed
    _exit(2);
  }
  ChildWatch watch(pid, nullptr);  // reaps it; the group learns of the death only by the deadline
  ASSERT_TRUE((*leader)->WaitReady(Deadline::After(seconds(60)), kFingerprint).ok());
  std::thread killer([pid] {
    std::this_thread::sleep_for(milliseconds(100));  // the leader is in the barrier by now
    kill(pid, SIGKILL);
  });
  float m[2] = {1, 2};
  const TimePoint start = Clock::now();
  Status st = (*leader)->AllGatherColumns(m, 1, 2, 0, 1);
  const double waited = SecondsSince(start);
  killer.join();
  watch.ExpectExit(seconds(10));
  const int status = watch.Join();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.ToString();
  EXPECT_NE(st.message().find("rank 1 (pid " + std::to_string(pid) + ")"), std::string::npos)
      << st.message();
  EXPECT_LT(waited, 5.0);
}

TEST(ShmTpGroupTest, AttachRefusesWhatIsNotAGroup) {
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  close(pipe_fds[1]);
  auto from_pipe = ShmTpGroup::Attach(pipe_fds[0], 1, seconds(1));  // takes and closes the fd
  EXPECT_FALSE(from_pipe.ok());
  EXPECT_NE(from_pipe.status().message().find("not a memfd"), std::string::npos)
      << from_pipe.status().message();

  int unsealed = memfd_create("test", MFD_CLOEXEC);
  ASSERT_GE(unsealed, 0);
  ASSERT_EQ(ftruncate(unsealed, 1 << 20), 0);
  auto from_unsealed = ShmTpGroup::Attach(unsealed, 1, seconds(1));
  EXPECT_EQ(from_unsealed.status().code(), StatusCode::kInvalidArgument);

  int small = memfd_create("test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(small, 0);
  ASSERT_EQ(ftruncate(small, 100), 0);
  ASSERT_EQ(fcntl(small, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  auto from_small = ShmTpGroup::Attach(small, 1, seconds(1));
  EXPECT_EQ(from_small.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(from_small.status().message().find("smaller"), std::string::npos);

  ShmTpGroupOptions options;
  options.size = 3;
  auto ranks = MakeGroup(options);
  ASSERT_EQ(ranks.size(), 3u);
  EXPECT_EQ(ShmTpGroup::Attach(dup(ranks[0]->fd()), 0, seconds(1)).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmTpGroup::Attach(dup(ranks[0]->fd()), 3, seconds(1)).status().code(),
            StatusCode::kInvalidArgument);
  auto twice = ShmTpGroup::Attach(dup(ranks[0]->fd()), 2, seconds(1));
  EXPECT_EQ(twice.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(twice.status().message().find("already attached"), std::string::npos);

  // Another magic: the first 8 bytes of the region.
  void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, ranks[0]->fd(), 0);
  ASSERT_NE(p, MAP_FAILED);
  uint64_t magic;
  std::memcpy(&magic, p, sizeof(magic));
  const uint64_t other = magic ^ 1;
  std::memcpy(p, &other, sizeof(other));
  auto wrong_magic = ShmTpGroup::Attach(dup(ranks[0]->fd()), 1, seconds(1));
  EXPECT_EQ(wrong_magic.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_magic.status().message().find("magic"), std::string::npos);
  std::memcpy(p, &magic, sizeof(magic));
  munmap(p, 4096);
}

TEST(ShmTpGroupTest, RefusesBadOptionsAndOversizedMessages) {
  ShmTpGroupOptions options;
  options.size = 0;
  EXPECT_EQ(ShmTpGroup::Create(options).status().code(), StatusCode::kInvalidArgument);
  options.size = 2;
  options.mailbox_bytes = 128;
  auto ranks = MakeGroup(options);
  ASSERT_EQ(ranks.size(), 2u);
  EXPECT_EQ(ranks[0]->Publish(std::string(129, 'z')).code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(ranks[0]->failed());
  EXPECT_EQ(ranks[1]->Publish("x").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(ranks[0]->Receive().status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(ranks[0]->MarkReady(kFingerprint).code(), StatusCode::kFailedPrecondition);
}

TEST(ShmTpGroupTest, BadColumnRangeIsInvalidAndFailsTheGroup) {
  ShmTpGroupOptions options;
  auto ranks = MakeGroup(options);
  ASSERT_EQ(ranks.size(), 2u);
  float m[4] = {};
  Status st = ranks[0]->AllGatherColumns(m, 1, 4, 2, 5);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("columns [2, 5) of a [1][4] matrix"), std::string::npos)
      << st.message();
  // The other rank learns at once instead of waiting for the deadline.
  EXPECT_EQ(ranks[1]->AllGatherColumns(m, 1, 4, 0, 2).code(), StatusCode::kUnavailable);

  options.gather_bytes = 64;  // 16 floats
  auto narrow = MakeGroup(options);
  ASSERT_EQ(narrow.size(), 2u);
  std::vector<float> wide(17);
  EXPECT_EQ(narrow[0]->AllGatherColumns(wide.data(), 1, 17, 0, 8).code(),
            StatusCode::kInvalidArgument);
}

TEST(ShmTpGroupTest, WaitReadyNeedsEveryWorkerWithTheSameFingerprint) {
  ShmTpGroupOptions options;
  options.size = 3;
  auto ranks = MakeGroup(options);
  ASSERT_EQ(ranks.size(), 3u);
  ASSERT_TRUE(ranks[1]->MarkReady(kFingerprint).ok());
  Status missing = ranks[0]->WaitReady(Deadline::After(milliseconds(200)), kFingerprint);
  EXPECT_EQ(missing.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(missing.message().find("rank 2"), std::string::npos) << missing.message();
  EXPECT_EQ(missing.message().find("rank 1"), std::string::npos) << missing.message();

  ASSERT_TRUE(ranks[2]->MarkReady(kFingerprint + 1).ok());
  Status mismatch = ranks[0]->WaitReady(Deadline::After(seconds(10)), kFingerprint);
  EXPECT_EQ(mismatch.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(mismatch.message().find("rank 2"), std::string::npos) << mismatch.message();
  EXPECT_NE(mismatch.message().find("0x123456789abcdef1"), std::string::npos);
  EXPECT_NE(mismatch.message().find("0x123456789abcdef0"), std::string::npos);

  // Ready from another thread while the leader waits.
  auto again = MakeGroup(options);
  ASSERT_EQ(again.size(), 3u);
  std::thread late([&] {
    std::this_thread::sleep_for(milliseconds(50));
    EXPECT_TRUE(again[1]->MarkReady(kFingerprint).ok());
    EXPECT_TRUE(again[2]->MarkReady(kFingerprint).ok());
  });
  EXPECT_TRUE(again[0]->WaitReady(Deadline::After(seconds(60)), kFingerprint).ok());
  late.join();
}

}  // namespace
}  // namespace pdserve
