#include "engine/shm_tp_group.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <new>
#include <thread>

#include <fmt/format.h>

namespace pdserve {
namespace {

constexpr uint64_t kMagic = 0x7064'7470'6772'7031;  // "pdtpgrp1"
constexpr uint32_t kVersion = 1;
constexpr size_t kControlBytes = 16 << 10;  // the control block, padded; the buffers follow
constexpr size_t kAlign = 64;
constexpr size_t kMaxBufferBytes = size_t{1} << 40;
// Polls before the first futex sleep: a few microseconds, so that ranks arriving together pay
// no sleep, while a longer wait leaves the core to others (2 cores run many threads here).
constexpr int kSpinPolls = 128;
// Longest single futex sleep: a waiter that missed a wake-up (Fail or Shutdown raced with its
// check) sees the flag within this.
constexpr Duration kSleepSlice = std::chrono::milliseconds(100);

enum FailState : uint32_t { kHealthy = 0, kWritingReason = 1, kFailed = 2 };

// Atomics in shared memory must not fall back to a process-local lock.
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<int32_t>::is_always_lock_free);
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "a futex word is 32 bits");

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

uint32_t* FutexWord(const std::atomic<uint32_t>& word) {
  return const_cast<uint32_t*>(reinterpret_cast<const uint32_t*>(&word));
}

// FUTEX_WAIT / FUTEX_WAKE, not their _PRIVATE forms: waiters may be in other processes.
// Sleeps while `word` holds `expected`, at most `timeout`; returns on a wake-up, a change, a
// signal or the timeout alike, so callers re-check their condition.
void FutexWait(const std::atomic<uint32_t>& word, uint32_t expected, Duration timeout) {
  const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count();
  timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  syscall(SYS_futex, FutexWord(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(const std::atomic<uint32_t>& word) {
  syscall(SYS_futex, FutexWord(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

double SecondsOf(Duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

// The start of the region: plain data and lock-free atomics at fixed offsets. The header is
// written once by Create before fd() leaves the leader. Futex words (barrier_generation,
// mailbox_seq, ack_event) change whenever a waiter's condition may have become true.
struct alignas(64) ShmTpGroup::Control {
  uint64_t magic;
  uint32_t version;
  uint32_t size;
  uint64_t gather_bytes;  // each of the two buffers
  uint64_t mailbox_bytes;
  uint64_t region_bytes;

  alignas(64) std::atomic<uint32_t> barrier_arrived;  // ranks at the current barrier
  std::atomic<uint32_t> barrier_generation;           // bumped by the last to arrive

  alignas(64) std::atomic<uint32_t> fail_state;  // FailState
  std::atomic<uint32_t> shutdown;
  std::atomic<uint32_t> mailbox_seq;  // messages published
  std::atomic<uint32_t> ack_event;    // bumped when a worker takes a message or is ready
  std::atomic<uint64_t> mailbox_length;
  uint32_t fail_reason_length;  // written before fail_state becomes kFailed
  char fail_reason[512];

  struct alignas(64) Rank {
    std::atomic<uint64_t> barriers;   // barriers entered (names the missing ranks on timeout)
    std::atomic<uint32_t> taken_seq;  // messages taken (workers)
    std::atomic<uint32_t> attached;
    std::atomic<uint32_t> ready;
    std::atomic<int32_t> pid;
    std::atomic<uint64_t> fingerprint;
  } ranks[kMaxRanks];
};

Result<std::unique_ptr<ShmTpGroup>> ShmTpGroup::Create(const ShmTpGroupOptions& options) {
  static_assert(sizeof(Control) <= kControlBytes);
  if (options.size < 1 || options.size > kMaxRanks) {
    return Status::InvalidArgument(
        fmt::format("tensor-parallel group of {} ranks (1..{})", options.size, kMaxRanks));
  }
  if (options.gather_bytes < sizeof(float) || options.gather_bytes > kMaxBufferBytes ||
      options.mailbox_bytes > kMaxBufferBytes) {
    return Status::InvalidArgument(fmt::format("tensor-parallel group buffers of {} and {} bytes",
                                               options.gather_bytes, options.mailbox_bytes));
  }
  if (options.deadline <= Duration::zero()) {
    return Status::InvalidArgument("tensor-parallel group deadline must be positive");
  }
  const size_t gather_bytes = RoundUp(options.gather_bytes, kAlign);
  const size_t mailbox_bytes = RoundUp(options.mailbox_bytes, kAlign);
  const size_t length = kControlBytes + 2 * gather_bytes + mailbox_bytes;
  int fd = memfd_create("pdserve-tp-group", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Status::FromErrno("memfd_create(tp group)", errno);
  // Sealed against resizing, so no rank's mapping can lose pages under it (SIGBUS).
  if (ftruncate(fd, static_cast<off_t>(length)) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    Status s = Status::FromErrno("sizing the tp group memfd", errno);
    close(fd);
    return s;
  }
  void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    Status s = Status::FromErrno("mmap(tp group)", errno);
    close(fd);
    return s;
  }
  Control* c = new (p) Control();
  c->version = kVersion;
  c->size = static_cast<uint32_t>(options.size);
  c->gather_bytes = gather_bytes;
  c->mailbox_bytes = mailbox_bytes;
  c->region_bytes = length;
  c->ranks[0].attached.store(1);
  c->ranks[0].pid.store(getpid());
  c->magic = kMagic;
  return std::unique_ptr<ShmTpGroup>(
      new ShmTpGroup(fd, static_cast<uint8_t*>(p), length, 0, options.deadline));
}

Result<std::unique_ptr<ShmTpGroup>> ShmTpGroup::Attach(int fd, int rank, Duration deadline) {
  auto refuse = [fd](Status s) {
    if (fd >= 0) close(fd);
    return s;
  };
  if (rank < 1 || rank >= kMaxRanks || deadline <= Duration::zero()) {
    return refuse(Status::InvalidArgument(
        fmt::format("attaching to a tp group as rank {} (workers are 1..size-1), deadline {:.3f} s",
                    rank, SecondsOf(deadline))));
  }
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0) return refuse(Status::FromErrno(fmt::format("fd {} is not a memfd", fd), errno));
  if ((seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
    return refuse(Status::InvalidArgument(
        fmt::format("fd {} is a memfd not sealed against resizing: not a tp group", fd)));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) return refuse(Status::FromErrno("fstat(tp group)", errno));
  const size_t length = static_cast<size_t>(st.st_size);
  if (length < kControlBytes) {
    return refuse(Status::InvalidArgument(
        fmt::format("tp group region of {} bytes is smaller than its control block ({})", length,
                    kControlBytes)));
  }
  void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return refuse(Status::FromErrno("mmap(tp group)", errno));
  // From here the group object owns the fd and the mapping.
  std::unique_ptr<ShmTpGroup> group(
      new ShmTpGroup(fd, static_cast<uint8_t*>(p), length, rank, deadline));
  const Control& c = group->control();
  if (c.magic != kMagic) {
    return Status::InvalidArgument(
        fmt::format("fd {} is not a tp group region (magic {:#x})", fd, c.magic));
  }
  if (c.version != kVersion) {
    return Status::FailedPrecondition(
        fmt::format("tp group region of version {}, this binary speaks {}", c.version, kVersion));
  }
  if (c.size < 1 || c.size > kMaxRanks || c.gather_bytes < kAlign || c.gather_bytes % kAlign ||
      c.mailbox_bytes % kAlign || c.gather_bytes > kMaxBufferBytes ||
      c.mailbox_bytes > kMaxBufferBytes || c.region_bytes != length ||
      kControlBytes + 2 * c.gather_bytes + c.mailbox_bytes != length) {
    return Status::DataLoss(
        fmt::format("tp group region of {} bytes has an inconsistent header", length));
  }
  if (rank >= static_cast<int>(c.size)) {
    return Status::InvalidArgument(
        fmt::format("rank {} out of range for a tp group of {} ranks", rank, c.size));
  }
  auto& me = group->control().ranks[rank];
  uint32_t unattached = 0;
  if (!me.attached.compare_exchange_strong(unattached, 1)) {
    return Status::FailedPrecondition(fmt::format("{} is already attached", group->RankName(rank)));
  }
  me.pid.store(getpid());
  return group;
}

ShmTpGroup::ShmTpGroup(int fd, uint8_t* base, size_t length, int rank, Duration deadline)
    : fd_(fd),
      base_(base),
      length_(length),
      rank_(rank),
      size_(static_cast<int>(control().size)),
      gather_bytes_(control().gather_bytes),
      deadline_(deadline) {}

ShmTpGroup::~ShmTpGroup() {
  if (rank_ == 0) Shutdown();
  munmap(base_, length_);
  close(fd_);
}

float* ShmTpGroup::gather_buffer(uint64_t which) const {
  return reinterpret_cast<float*>(base_ + kControlBytes + (which % 2) * gather_bytes_);
}

uint8_t* ShmTpGroup::mailbox() const { return base_ + kControlBytes + 2 * gather_bytes_; }

Status ShmTpGroup::AllGatherColumns(float* data, int rows, int width, int col_begin, int col_end) {
  if (failed()) return FailedStatus();
  const size_t row_bytes = static_cast<size_t>(std::max(width, 0)) * sizeof(float);
  std::string bad;
  if (rows < 0 || width < 0 || col_begin < 0 || col_begin > col_end || col_end > width) {
    bad = fmt::format("columns [{}, {}) of a [{}][{}] matrix", col_begin, col_end, rows, width);
  } else if (row_bytes > gather_bytes_) {
    bad = fmt::format("rows of {} bytes, wider than the {}-byte gather buffer", row_bytes,
                      gather_bytes_);
  } else if (data == nullptr && rows > 0 && width > 0) {
    bad = "no data";
  }
  if (!bad.empty()) {
    // The other ranks would wait for this one until the deadline: fail them now.
    std::string why = fmt::format("{} called AllGatherColumns with {}", RankName(rank_), bad);
    Fail(why);
    return Status::InvalidArgument(why);
  }
  if (rows == 0 || width == 0) return Status::Ok();
  // Why one barrier per block suffices: block k goes through buffer k % 2. A rank writes that
  // buffer again only at block k + 2, after passing the barrier of block k + 1, which completes
  // only when every rank has arrived there, i.e. has finished copying block k out. So no rank
  // overwrites a buffer another still reads, and the barrier itself orders writes before reads.
  const int block_rows = static_cast<int>(std::min<size_t>(gather_bytes_ / row_bytes, rows));
  const size_t own = static_cast<size_t>(col_end - col_begin) * sizeof(float);
  for (int row0 = 0; row0 < rows; row0 += block_rows) {
    const int n = std::min(block_rows, rows - row0);
    float* shared = gather_buffer(barriers_entered_);
    float* block = data + static_cast<size_t>(row0) * width;
    for (int r = 0; r < n; ++r) {
      const size_t at = static_cast<size_t>(r) * width;
      std::memcpy(shared + at + col_begin, block + at + col_begin, own);
    }
    PD_RETURN_IF_ERROR(Barrier());
    for (int r = 0; r < n; ++r) {
      const size_t at = static_cast<size_t>(r) * width;
      std::memcpy(block + at, shared + at, col_begin * sizeof(float));
      std::memcpy(block + at + col_end, shared + at + col_end, (width - col_end) * sizeof(float));
    }
  }
  return Status::Ok();
}

Status ShmTpGroup::Barrier() {
  Control& c = control();
  // Read before arriving: the generation cannot move on until this rank has arrived.
  const uint32_t generation = c.barrier_generation.load(std::memory_order_acquire);
  c.ranks[rank_].barriers.store(++barriers_entered_, std::memory_order_relaxed);
  // acq_rel: the last to arrive acquires every rank's buffer writes, and its generation bump
  // releases them to the waiters. It resets the count first: no rank can arrive at the next
  // barrier before it sees the new generation.
  if (c.barrier_arrived.fetch_add(1, std::memory_order_acq_rel) + 1 ==
      static_cast<uint32_t>(size_)) {
    c.barrier_arrived.store(0, std::memory_order_relaxed);
    c.barrier_generation.fetch_add(1, std::memory_order_release);
    FutexWakeAll(c.barrier_generation);
    return Status::Ok();
  }
  const TimePoint start = Clock::now();
  Status s = WaitFor(c.barrier_generation, Deadline::After(deadline_), [&] {
    return c.barrier_generation.load(std::memory_order_acquire) != generation;
  });
  if (!s.in_progress()) return s;
  std::string missing;
  for (int r = 0; r < size_; ++r) {
    if (c.ranks[r].barriers.load(std::memory_order_relaxed) < barriers_entered_) {
      missing += (missing.empty() ? "" : ", ") + RankName(r);
    }
  }
  std::string why = fmt::format("{} timed out after {:.1f} s in a collective, waiting for {}",
                                RankName(rank_), SecondsOf(Clock::now() - start), missing);
  Fail(why);
  return Status::DeadlineExceeded(why);
}

template <typename Done>
Status ShmTpGroup::WaitFor(const std::atomic<uint32_t>& word, Deadline deadline, Done done) const {
  for (int polls = 0;; ++polls) {
    // Read the word before the condition: a change after this read ends the sleep at once.
    const uint32_t seen = word.load(std::memory_order_acquire);
    if (done()) return Status::Ok();
    if (failed()) return FailedStatus();
    if (polls < kSpinPolls) {
      CpuRelax();
      continue;
    }
    if (deadline.Passed()) return Status::InProgress();
    FutexWait(word, seen, std::min(kSleepSlice, deadline.Remaining()));
  }
}

Status ShmTpGroup::MarkReady(uint64_t fingerprint) {
  if (rank_ == 0)
    return Status::FailedPrecondition("MarkReady is for workers; rank 0 WaitReady()s");
  if (failed()) return FailedStatus();
  Control& c = control();
  c.ranks[rank_].fingerprint.store(fingerprint, std::memory_order_relaxed);
  c.ranks[rank_].ready.store(1, std::memory_order_release);
  c.ack_event.fetch_add(1, std::memory_order_release);
  FutexWakeAll(c.ack_event);
  return Status::Ok();
}

Status ShmTpGroup::WaitReady(Deadline deadline, uint64_t fingerprint) {
  if (rank_ != 0) return Status::FailedPrecondition("WaitReady is for rank 0");
  const Control& c = control();
  const TimePoint start = Clock::now();
  Status mismatch;
  Status s = WaitFor(c.ack_event, deadline, [&] {
    bool all = true;
    for (int r = 1; r < size_; ++r) {
      if (!c.ranks[r].ready.load(std::memory_order_acquire)) {
        all = false;
        continue;
      }
      const uint64_t theirs = c.ranks[r].fingerprint.load(std::memory_order_relaxed);
      if (theirs != fingerprint) {
        mismatch = Status::FailedPrecondition(
            fmt::format("{} loaded model fingerprint {:#018x}, the leader {:#018x}", RankName(r),
                        theirs, fingerprint));
        return true;
      }
    }
    return all;
  });
  if (!mismatch.ok()) return mismatch;
  if (!s.in_progress()) return s;
  std::string missing;
  for (int r = 1; r < size_; ++r) {
    if (!c.ranks[r].ready.load(std::memory_order_acquire)) {
      // A rank that attached is loading; one that did not never got as far as the group.
      missing += fmt::format("{}{}", missing.empty() ? "" : ", ",
                             c.ranks[r].attached.load(std::memory_order_acquire)
                                 ? RankName(r)
                                 : fmt::format("rank {} (not attached)", r));
    }
  }
  return Status::DeadlineExceeded(fmt::format("tensor-parallel {} not ready after {:.1f} s",
                                              missing, SecondsOf(Clock::now() - start)));
}

Status ShmTpGroup::Publish(std::string_view bytes) {
  if (rank_ != 0) return Status::FailedPrecondition("only rank 0 publishes");
  Control& c = control();
  if (bytes.size() > c.mailbox_bytes) {
    return Status::InvalidArgument(fmt::format("message of {} bytes exceeds the {}-byte tp mailbox",
                                               bytes.size(), c.mailbox_bytes));
  }
  if (failed()) return FailedStatus();
  const uint32_t seq = c.mailbox_seq.load(std::memory_order_relaxed);  // only rank 0 writes it
  auto taken = [&](int r) { return c.ranks[r].taken_seq.load(std::memory_order_acquire) == seq; };
  const TimePoint start = Clock::now();
  Status s = WaitFor(c.ack_event, Deadline::After(deadline_), [&] {
    for (int r = 1; r < size_; ++r) {
      if (!taken(r)) return false;
    }
    return true;
  });
  if (s.in_progress()) {
    std::string missing;
    for (int r = 1; r < size_; ++r) {
      if (!taken(r)) missing += (missing.empty() ? "" : ", ") + RankName(r);
    }
    std::string why =
        fmt::format("{} timed out after {:.1f} s waiting for {} to take the previous step",
                    RankName(0), SecondsOf(Clock::now() - start), missing);
    Fail(why);
    return Status::DeadlineExceeded(why);
  }
  PD_RETURN_IF_ERROR(s);
  if (!bytes.empty()) std::memcpy(mailbox(), bytes.data(), bytes.size());
  c.mailbox_length.store(bytes.size(), std::memory_order_relaxed);
  c.mailbox_seq.store(seq + 1, std::memory_order_release);
  FutexWakeAll(c.mailbox_seq);
  return Status::Ok();
}

Result<std::string> ShmTpGroup::Receive() {
  if (rank_ == 0) return Status::FailedPrecondition("rank 0 publishes; workers receive");
  Control& c = control();
  const uint32_t taken = c.ranks[rank_].taken_seq.load(std::memory_order_relaxed);
  bool shut_down = false;
  PD_RETURN_IF_ERROR(WaitFor(c.mailbox_seq, Deadline::Never(), [&] {
    shut_down = c.shutdown.load(std::memory_order_acquire) != 0;
    return shut_down || c.mailbox_seq.load(std::memory_order_acquire) != taken;
  }));
  if (shut_down) return Status::Cancelled("the tensor-parallel leader shut the group down");
  const uint64_t length = c.mailbox_length.load(std::memory_order_relaxed);
  if (length > c.mailbox_bytes) {
    std::string why =
        fmt::format("tp mailbox holds a message of {} bytes, over its {}", length, c.mailbox_bytes);
    Fail(why);
    return Status::DataLoss(why);
  }
  std::string message(reinterpret_cast<const char*>(mailbox()), length);
  // Released after the copy: rank 0 may overwrite the mailbox once every worker took it.
  c.ranks[rank_].taken_seq.store(taken + 1, std::memory_order_release);
  c.ack_event.fetch_add(1, std::memory_order_release);
  FutexWakeAll(c.ack_event);
  return message;
}

void ShmTpGroup::Fail(std::string_view why) {
  Control& c = control();
  uint32_t healthy = kHealthy;
  if (c.fail_state.compare_exchange_strong(healthy, kWritingReason, std::memory_order_acq_rel)) {
    const size_t n = std::min(why.size(), sizeof(c.fail_reason));
    std::memcpy(c.fail_reason, why.data(), n);
    c.fail_reason_length = static_cast<uint32_t>(n);
    c.fail_state.store(kFailed, std::memory_order_release);
  }
  // Waiters re-check the flag when woken; one that missed this wake-up, within a sleep slice.
  FutexWakeAll(c.barrier_generation);
  FutexWakeAll(c.mailbox_seq);
  FutexWakeAll(c.ack_event);
}

bool ShmTpGroup::failed() const {
  return control().fail_state.load(std::memory_order_acquire) != kHealthy;
}

Status ShmTpGroup::FailedStatus() const {
  const Control& c = control();
  if (c.fail_state.load(std::memory_order_acquire) == kHealthy) return Status::Ok();
  // The first Fail() copies its reason in nanoseconds; wait a little unless it died mid-copy.
  for (int i = 0; i < 1000 && c.fail_state.load(std::memory_order_acquire) == kWritingReason; ++i) {
    std::this_thread::yield();
  }
  if (c.fail_state.load(std::memory_order_acquire) != kFailed) {
    return Status::Unavailable("tensor-parallel group failed (no reason recorded)");
  }
  return Status::Unavailable("tensor-parallel group failed: " +
                             std::string(c.fail_reason, c.fail_reason_length));
}

void ShmTpGroup::Shutdown() {
  Control& c = control();
  c.shutdown.store(1, std::memory_order_release);
  FutexWakeAll(c.mailbox_seq);
}

std::string ShmTpGroup::RankName(int rank) const {
  return fmt::format("rank {} (pid {})", rank,
                     control().ranks[rank].pid.load(std::memory_order_relaxed));
}

}  // namespace pdserve
