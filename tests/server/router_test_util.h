// Helpers for the router and `pdserve up` tests: child processes with a piped stdout, the tiny
// synthetic model, free ports and HTTP polling. Test-only; each helper object is used from
// one thread.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "testing/test_models.h"

namespace pdserve::testing {

// A child process (argv[0] is the executable path) whose stdout is readable line by line.
// The destructor kills its process group with SIGKILL and reaps it.
class Subprocess {
 public:
  explicit Subprocess(const std::vector<std::string>& argv);
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  // The next stdout line containing `needle`, or nullopt at EOF or the deadline.
  std::optional<std::string> ReadLineContaining(const std::string& needle, Deadline deadline);
  void Signal(int signal);
  // The wait status once the process exited, or nullopt at the deadline.
  std::optional<int> Wait(Deadline deadline);

 private:
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::string buffer_;
  bool reaped_ = false;
};

int FreePort();
// True once GET http://127.0.0.1:port/health answers 200 before the deadline.
bool WaitHealthy(int port, Deadline deadline);
// True if `pid` names a live process (a zombie counts as gone).
bool ProcessAlive(pid_t pid);
// Direct children of `pid`, read from /proc/<pid>/task/*/children.
std::vector<pid_t> ChildrenOf(pid_t pid);

}  // namespace pdserve::testing
