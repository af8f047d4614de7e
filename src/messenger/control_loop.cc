#include "messenger/control_loop.h"

namespace pdserve::messenger {

ControlLoop::ControlLoop(std::chrono::milliseconds tick, std::function<void()> on_tick)
    : tick_(tick), on_tick_(std::move(on_tick)) {}

ControlLoop::~ControlLoop() { Stop(); }

void ControlLoop::Start() {
  thread_ = std::thread([this] { Run(); });
}

bool ControlLoop::Post(std::function<void()> fn) {
  {
    MutexLock lock(&mu_);
    if (stopped_) return false;
    queue_.push_back(std::move(fn));
  }
  cv_.NotifyOne();
  return true;
}

void ControlLoop::Stop() {
  {
    MutexLock lock(&mu_);
    stopped_ = true;
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
  MutexLock lock(&mu_);
  queue_.clear();
}

bool ControlLoop::TakeQueue(TimePoint deadline, std::deque<std::function<void()>>* batch) {
  MutexLock lock(&mu_);
  while (!stopped_ && queue_.empty()) {
    if (cv_.WaitUntil(&mu_, deadline) == std::cv_status::timeout) break;
  }
  if (stopped_) return false;
  batch->swap(queue_);
  return true;
}

void ControlLoop::Run() {
  TimePoint next_tick = Clock::now() + tick_;
  while (true) {
    std::deque<std::function<void()>> batch;
    if (!TakeQueue(next_tick, &batch)) return;
    for (auto& fn : batch) fn();
    if (Clock::now() >= next_tick) {
      if (on_tick_) on_tick_();
      next_tick = Clock::now() + tick_;
    }
  }
}

}  // namespace pdserve::messenger
