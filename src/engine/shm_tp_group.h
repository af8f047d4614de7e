// ShmTpGroup: the ranks of one tensor-parallel replica over one shared-memory region (a memfd),
// whether the ranks are threads or processes (DESIGN.md §1 "rank workers"). Rank 0, the leader,
// creates the region and hands fd() to the workers (ranks 1..size-1), which Attach to it. The
// region holds a control block, two gather buffers and one leader->workers mailbox.
//
// Every wait sleeps on a process-shared futex in short slices and re-checks the group's failed
// flag, so it neither burns a core nor outlives Fail(). Waits for another rank give up at the
// group's deadline and fail the group; once failed, every call of every rank returns Unavailable
// with the first reason given. There is no recovery: a failed group is torn down and made anew.
//
// Threads: one object belongs to one rank and is used from one thread at a time, except Fail(),
// failed() and Shutdown(), which any thread may call.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/clock.h"
#include "common/status.h"
#include "model/tp_group.h"

namespace pdserve {

struct ShmTpGroupOptions {
  int size = 2;                    // ranks, 1..ShmTpGroup::kMaxRanks
  size_t gather_bytes = 16 << 20;  // bytes of EACH of the two gather buffers
  size_t mailbox_bytes = 4 << 20;  // capacity of the leader->workers message slot
  // Longest wait for another rank inside a collective (and in Publish) before the group fails.
  Duration deadline = std::chrono::seconds(120);
};

class ShmTpGroup : public TpGroup {
 public:
  static constexpr int kMaxRanks = 64;

  // Rank 0 creates a zeroed region (a sealed memfd, close-on-exec: whoever starts a worker
  // passes fd() on, e.g. with dup2, which clears close-on-exec). InvalidArgument for bad options.
  static Result<std::unique_ptr<ShmTpGroup>> Create(const ShmTpGroupOptions& options);
  // A worker maps the region from `fd` (the creator's, dup'd or inherited) as `rank`
  // (1..size-1), waiting at most `deadline` for other ranks in collectives. Takes ownership of
  // `fd`: it is closed on error too. Errors: not a sealed memfd, a region too small or of another
  // magic, version or layout, a rank out of range or already attached.
  static Result<std::unique_ptr<ShmTpGroup>> Attach(int fd, int rank, Duration deadline);

  ~ShmTpGroup() override;  // the leader's also Shutdown()s; then unmaps and closes the fd
  ShmTpGroup(const ShmTpGroup&) = delete;
  ShmTpGroup& operator=(const ShmTpGroup&) = delete;

  int fd() const { return fd_; }  // owned by this object
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // TpGroup::AllGatherColumns. rows == 0 or width == 0 returns Ok with no barrier (every rank
  // sees the same shape). A matrix larger than a gather buffer goes in row blocks, one barrier
  // each. Bad arguments (a column range outside [0, width), a row wider than a gather buffer)
  // return InvalidArgument and fail the group, since the other ranks would otherwise wait for
  // this one until the deadline.
  Status AllGatherColumns(float* data, int rows, int width, int col_begin, int col_end) override;

  // Start-up handshake. A worker calls MarkReady once loaded, with the fingerprint of what it
  // loaded (model config and weights). The leader's WaitReady returns Ok once every worker is
  // ready with `fingerprint`; FailedPrecondition naming a rank that differs and both values;
  // DeadlineExceeded naming the ranks not ready. Neither fails the group: the leader decides.
  Status MarkReady(uint64_t fingerprint);
  Status WaitReady(Deadline deadline, uint64_t fingerprint);

  // Leader: waits (at most the group's deadline, else fails the group) until every worker took
  // the previous message, then posts `bytes` as the next one. InvalidArgument if larger than
  // the mailbox.
  Status Publish(std::string_view bytes);
  // Worker: the next message. Waits without deadline (an idle node waits for work); Cancelled
  // once the leader called Shutdown, Unavailable once the group failed.
  Result<std::string> Receive();

  // Fails the group with `why` (e.g. "rank 1 (pid 123) killed by signal 9"): every rank's
  // current and later waits return Unavailable with the first reason given. Any rank, any thread.
  void Fail(std::string_view why);
  bool failed() const;
  // Ok while the group is healthy; once failed, Unavailable with the first reason given (what
  // every rank's calls return). Any rank, any thread.
  Status FailedStatus() const;
  // Leader: workers' Receive returns Cancelled from now on. Any thread.
  void Shutdown();

 private:
  struct Control;  // the control block at the start of the region (shm_tp_group.cc)

  ShmTpGroup(int fd, uint8_t* base, size_t length, int rank, Duration deadline);
  Control& control() const { return *reinterpret_cast<Control*>(base_); }
  float* gather_buffer(uint64_t which) const;  // buffer which % 2
  uint8_t* mailbox() const;

  // One process-shared barrier of all ranks (see AllGatherColumns for why one suffices).
  Status Barrier();
  // Waits until `done()`, sleeping on the futex `word` that changes (and is woken) whenever
  // `done()` may have become true. Returns Ok, the group's failure, or InProgress at `deadline`.
  template <typename Done>
  Status WaitFor(const std::atomic<uint32_t>& word, Deadline deadline, Done done) const;
  std::string RankName(int rank) const;  // "rank 2 (pid 1234)"

  const int fd_;
  uint8_t* const base_;
  const size_t length_;
  const int rank_;
  const int size_;
  const size_t gather_bytes_;  // of each buffer
  const Duration deadline_;
  uint64_t barriers_entered_ = 0;  // by this rank; the same count on every rank
};

}  // namespace pdserve
