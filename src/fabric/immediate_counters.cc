#include "fabric/immediate_counters.h"

#include <fmt/format.h>

namespace pdserve::fabric {

Status ImmediateCounters::Expect(uint32_t imm, uint32_t count, Deadline deadline,
                                 Callback callback) {
  MutexLock lock(&mu_);
  if (expectations_.count(imm) != 0) {
    return Status::AlreadyExists(fmt::format("an expectation for immediate {:#x} exists", imm));
  }
  Expectation e{count, 0, deadline, std::move(callback)};
  if (auto it = early_.find(imm); it != early_.end()) {
    uint32_t taken = std::min(it->second, count);
    e.arrived = taken;
    it->second -= taken;
    if (it->second == 0) early_.erase(it);
  }
  if (e.arrived >= e.count) {
    ready_.push_back(Fired{std::move(e.callback), Status::Ok(), e.arrived});
    return Status::Ok();
  }
  expectations_.emplace(imm, std::move(e));
  return Status::Ok();
}

ImmediateCounters::Arrival ImmediateCounters::Arrive(uint32_t imm, bool remember,
                                                     std::vector<Fired>* fired) {
  MutexLock lock(&mu_);
  if (auto it = expectations_.find(imm); it != expectations_.end()) {
    Expectation& e = it->second;
    if (++e.arrived >= e.count) {
      fired->push_back(Fired{std::move(e.callback), Status::Ok(), e.arrived});
      expectations_.erase(it);
    }
    return Arrival::kCounted;
  }
  if (!remember) return Arrival::kUnmatched;
  auto it = early_.find(imm);
  if (it == early_.end()) {
    // Bounded so that a stream of stray immediates cannot grow memory without limit.
    if (early_.size() >= max_early_values_) return Arrival::kUnmatched;
    it = early_.emplace(imm, 0).first;
  }
  ++it->second;
  return Arrival::kRemembered;
}

bool ImmediateCounters::Remove(uint32_t imm) {
  MutexLock lock(&mu_);
  bool removed = expectations_.erase(imm) != 0;
  removed = early_.erase(imm) != 0 || removed;
  return removed;
}

TimePoint ImmediateCounters::TakeDue(TimePoint now, std::vector<Fired>* fired) {
  MutexLock lock(&mu_);
  for (Fired& f : ready_) fired->push_back(std::move(f));
  ready_.clear();
  TimePoint earliest = TimePoint::max();
  for (auto it = expectations_.begin(); it != expectations_.end();) {
    Expectation& e = it->second;
    if (e.deadline.at() <= now) {
      fired->push_back(Fired{std::move(e.callback),
                             Status::DeadlineExceeded(
                                 fmt::format("expected {} writes with immediate {:#x}, {} arrived",
                                             e.count, it->first, e.arrived)),
                             e.arrived});
      it = expectations_.erase(it);
    } else {
      earliest = std::min(earliest, e.deadline.at());
      ++it;
    }
  }
  return earliest;
}

void ImmediateCounters::CancelAll(const Status& status, std::vector<Fired>* fired) {
  MutexLock lock(&mu_);
  for (Fired& f : ready_) fired->push_back(std::move(f));
  ready_.clear();
  for (auto& [imm, e] : expectations_) {
    fired->push_back(Fired{std::move(e.callback), status, e.arrived});
  }
  expectations_.clear();
}

uint32_t ImmediateCounters::EarlyArrivals(uint32_t imm) const {
  MutexLock lock(&mu_);
  auto it = early_.find(imm);
  return it == early_.end() ? 0 : it->second;
}

size_t ImmediateCounters::PendingExpectations() const {
  MutexLock lock(&mu_);
  return expectations_.size();
}

}  // namespace pdserve::fabric
