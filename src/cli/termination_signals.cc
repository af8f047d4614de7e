#include "cli/termination_signals.h"

#include <pthread.h>

#include <chrono>
#include <ctime>

namespace pdserve::cli {

TerminationSignals::TerminationSignals() {
  sigemptyset(&set_);
  sigaddset(&set_, SIGINT);
  sigaddset(&set_, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set_, &old_);
}

TerminationSignals::~TerminationSignals() {
  while (WaitFor(Duration::zero()) != 0) {
  }
  pthread_sigmask(SIG_SETMASK, &old_, nullptr);
}

int TerminationSignals::Wait() {
  for (;;) {
    int signal = 0;
    if (sigwait(&set_, &signal) == 0) return signal;
  }
}

int TerminationSignals::WaitFor(Duration timeout) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count();
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  const int signal = sigtimedwait(&set_, nullptr, &ts);
  return signal > 0 ? signal : 0;  // EAGAIN (timeout) and EINTR both mean "none yet"
}

}  // namespace pdserve::cli
