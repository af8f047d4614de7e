// ControlLoop: the one thread on which a messenger's state lives. Everything that changes that
// state — decoded control messages, engine callbacks, fabric completions and expectations,
// periodic ticks — is posted here as a closure, so the state needs no lock of its own and the
// callers (fabric progress threads, the engine loop) never block on messenger work.
//
// Thread contract: Post and Stop may be called from any thread, including fabric and engine
// callbacks. Closures run in order on the loop thread; a closure posted after Stop is dropped.
// The tick runs on the loop thread every `tick` (and whenever Post wakes the loop late).
// Held by shared_ptr so that callbacks which outlive their messenger (an engine's final
// outputs during its destruction) can still Post harmlessly.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <thread>

#include "common/clock.h"
#include "common/mutex.h"

namespace pdserve::messenger {

class ControlLoop {
 public:
  ControlLoop(std::chrono::milliseconds tick, std::function<void()> on_tick);
  ~ControlLoop();  // Stop()
  ControlLoop(const ControlLoop&) = delete;
  ControlLoop& operator=(const ControlLoop&) = delete;

  void Start();
  // Returns false (and drops the closure) once stopped.
  bool Post(std::function<void()> fn);
  // Runs nothing more; joins the thread. Idempotent; not from the loop thread.
  void Stop();

 private:
  void Run() EXCLUDES(mu_);
  // Waits until something is queued, Stop, or `deadline`; takes the queue into *batch. False
  // once stopped.
  bool TakeQueue(TimePoint deadline, std::deque<std::function<void()>>* batch) EXCLUDES(mu_);

  const std::chrono::milliseconds tick_;
  std::function<void()> on_tick_;
  Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> queue_ GUARDED_BY(mu_);
  bool stopped_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace pdserve::messenger
