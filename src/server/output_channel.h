// OutputChannel: hands one request's engine outputs from the engine's loop thread (Push, which
// never blocks beyond a short lock) to the HTTP thread serving the request (Wait, which waits
// until a deadline). Thread-safe; shared by both sides through a shared_ptr, so a late
// callback after the HTTP side gave up is harmless.
#pragma once

#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "engine/request.h"

namespace pdserve::server {

class OutputChannel {
 public:
  void Push(const RequestOutput& out) EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      pending_.push_back(out);
    }
    cv_.NotifyOne();
  }

  // Moves every pending output into *outs (cleared first). Waits until there is one or the
  // deadline passes; returns false on timeout with *outs empty.
  bool Wait(std::vector<RequestOutput>* outs, Deadline deadline) EXCLUDES(mu_) {
    outs->clear();
    MutexLock lock(&mu_);
    while (pending_.empty()) {
      if (cv_.WaitUntil(&mu_, deadline.at()) == std::cv_status::timeout && pending_.empty()) {
        return false;
      }
    }
    outs->swap(pending_);
    return true;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  std::vector<RequestOutput> pending_ GUARDED_BY(mu_);
};

}  // namespace pdserve::server
