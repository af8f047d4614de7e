// Process plumbing shared by `pdserve router`, `pdserve up` and `pdserve serve`: HOST:PORT
// parsing, the API key from flag or environment, and SIGINT/SIGTERM delivered synchronously.
// Used from main()'s thread only.
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
// "HOST:PORT" with PORT in [0, 65535] (0: any free port); the error names `flag`.
Result<HostPort> ParseHostPort(const std::string& flag, const std::string& text);

// The API key may come from the environment instead of a flag, which every local user can read
// in `ps`; `pdserve up` hands its key to its nodes this way.
inline constexpr char kApiKeyEnv[] = "PDSERVE_API_KEY";
// `flag` if set, else $PDSERVE_API_KEY, else "".
std::string ApiKeyFromFlagOrEnv(const std::string& flag);

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
