// TerminationSignals: the one signal policy of pdserve's long-running commands (`serve`,
// `router`, `up`): SIGINT and SIGTERM are blocked in every thread and taken synchronously by
// main()'s thread, which then shuts down in order. Used from main()'s thread only.
#pragma once

#include <csignal>

#include "common/clock.h"

namespace pdserve::cli {

// Blocks SIGINT and SIGTERM in the calling thread for its lifetime. Construct it before any
// thread starts: threads inherit the mask, so the signals stay pending until Wait/WaitFor
// takes them, and no handler runs in an arbitrary thread. On destruction it discards the ones
// still pending (a second Ctrl-C, or a second SIGTERM a node sends itself, during the shutdown
// the first began), so that the command ends with the exit code its shutdown chose, then
// restores the old mask.
class TerminationSignals {
 public:
  TerminationSignals();
  ~TerminationSignals();
  TerminationSignals(const TerminationSignals&) = delete;
  TerminationSignals& operator=(const TerminationSignals&) = delete;

  // Blocks until SIGINT or SIGTERM; returns its number.
  int Wait();
  // The signal if one arrives within `timeout`, else 0.
  int WaitFor(Duration timeout);

 private:
  sigset_t set_;
  sigset_t old_;
};

}  // namespace pdserve::cli
