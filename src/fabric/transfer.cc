#include "fabric/transfer.h"

namespace pdserve::fabric {

void TransferCounter::Record(const Status& status) {
  std::lock_guard lock(mu_);
  if (status.ok()) {
    succeeded_.fetch_add(1, std::memory_order_acq_rel);
  } else {
    if (first_error_.ok()) first_error_ = status;
    failed_.fetch_add(1, std::memory_order_acq_rel);
  }
  cv_.notify_all();
}

Status TransferCounter::first_error() const {
  std::lock_guard lock(mu_);
  return first_error_;
}

bool TransferCounter::WaitFor(uint64_t n, Deadline deadline) const {
  std::unique_lock lock(mu_);
  return cv_.wait_until(lock, deadline.at(), [&] { return finished() >= n; });
}

}  // namespace pdserve::fabric
