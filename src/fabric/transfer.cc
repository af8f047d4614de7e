#include "fabric/transfer.h"

namespace pdserve::fabric {

void TransferCounter::Record(const Status& status) {
  MutexLock lock(&mu_);
  if (status.ok()) {
    succeeded_.fetch_add(1, std::memory_order_acq_rel);
  } else {
    if (first_error_.ok()) first_error_ = status;
    failed_.fetch_add(1, std::memory_order_acq_rel);
  }
  cv_.NotifyAll();
}

Status TransferCounter::first_error() const {
  MutexLock lock(&mu_);
  return first_error_;
}

bool TransferCounter::WaitFor(uint64_t n, Deadline deadline) const {
  MutexLock lock(&mu_);
  while (finished() < n) {
    if (cv_.WaitUntil(&mu_, deadline.at()) == std::cv_status::timeout) return finished() >= n;
  }
  return true;
}

}  // namespace pdserve::fabric
