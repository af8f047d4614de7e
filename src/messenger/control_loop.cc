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
    std::lock_guard lock(mu_);
    if (stopped_) return false;
    queue_.push_back(std::move(fn));
  }
  cv_.notify_one();
  return true;
}

void ControlLoop::Stop() {
  {
    std::lock_guard lock(mu_);
    stopped_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(mu_);
  queue_.clear();
}

void ControlLoop::Run() {
  TimePoint next_tick = Clock::now() + tick_;
  while (true) {
    std::deque<std::function<void()>> batch;
    {
      std::unique_lock lock(mu_);
      cv_.wait_until(lock, next_tick, [this] { return stopped_ || !queue_.empty(); });
      if (stopped_) return;
      batch.swap(queue_);
    }
    for (auto& fn : batch) fn();
    if (Clock::now() >= next_tick) {
      if (on_tick_) on_tick_();
      next_tick = Clock::now() + tick_;
    }
  }
}

}  // namespace pdserve::messenger
