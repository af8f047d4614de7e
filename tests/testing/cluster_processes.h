// Helpers for the tests that start a cluster's processes (the router, `pdserve up`, nodes being
// drained or stalled): child processes with a piped stdout, the tiny synthetic model, free
// ports and HTTP polling. Test-only; each helper object is used from one thread.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/subprocess.h"
#include "testing/processes.h"  // ProcessAlive, ChildrenOf for the users of this header
#include "testing/test_models.h"

namespace pdserve::testing {

// A child process (argv[0] is the executable path) in its own process group, whose stdout is
// readable line by line: pdserve::Subprocess with the tests' conveniences (a failed start
// shows up as pid() == -1 and EOF; statuses as std::optional). Destruction kills its group.
class Subprocess {
 public:
  // With `with_stderr`, stderr (the log) is read along with stdout.
  explicit Subprocess(const std::vector<std::string>& argv, bool with_stderr = false);

  pid_t pid() const { return process_ ? process_->pid() : -1; }
  // The next stdout line containing `needle`, or nullopt at EOF or the deadline.
  std::optional<std::string> ReadLineContaining(const std::string& needle, Deadline deadline);
  void Signal(int signal);
  // How the process ended, or nullopt at the deadline.
  std::optional<ExitStatus> Wait(Deadline deadline);

 private:
  std::optional<::pdserve::Subprocess> process_;
};

int FreePort();
// True once GET http://127.0.0.1:port/health answers 200 before the deadline.
bool WaitHealthy(int port, Deadline deadline);

}  // namespace pdserve::testing
