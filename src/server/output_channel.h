// OutputChannel: hands one request's engine outputs from the engine's loop thread (Push, which
// never blocks beyond a short lock) to the HTTP thread serving the request (Wait, which waits
// until a deadline). Thread-safe; shared by both sides through a shared_ptr, so a late
// callback after the HTTP side gave up is harmless.
#pragma once

#include <condition_variable>
#include <mutex>
#include <vector>

#include "common/clock.h"
#include "engine/request.h"

namespace pdserve::server {

class OutputChannel {
 public:
  void Push(const RequestOutput& out) {
    {
      std::lock_guard lock(mu_);
      pending_.push_back(out);
    }
    cv_.notify_one();
  }

  // Moves every pending output into *outs (cleared first). Waits until there is one or the
  // deadline passes; returns false on timeout with *outs empty.
  bool Wait(std::vector<RequestOutput>* outs, Deadline deadline) {
    outs->clear();
    std::unique_lock lock(mu_);
    if (!cv_.wait_until(lock, deadline.at(), [&] { return !pending_.empty(); })) return false;
    outs->swap(pending_);
    return true;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<RequestOutput> pending_;  // guarded by mu_
};

}  // namespace pdserve::server
