// Process plumbing shared by `pdserve router` and `pdserve up`: HOST:PORT parsing and
// SIGINT/SIGTERM delivered synchronously. Used from main()'s thread only.
#pragma once

#include <csignal>
#include <string>

#include "common/clock.h"
#include "common/status.h"

namespace pdserve::cli {

struct HostPort {
  std::string host;
  int port = 0;
};
// "HOST:PORT" with PORT in [0, 65535] (0: any free port).
Result<HostPort> ParseHostPort(const std::string& text);

// Blocks SIGINT and SIGTERM in the calling thread for its lifetime. Construct it before any
// thread starts: threads inherit the mask, so the signals stay pending until Wait/WaitFor
// takes them, and no handler runs in an arbitrary thread. Restores the old mask on destruction.
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
