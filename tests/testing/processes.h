// What tests learn about processes from /proc, and a bounded run of a command: is a pid alive,
// its children, a /proc file, waiting until a set of pids is gone, a command's (or the pdserve
// binary's) exit status and combined output. For tests only; every function may be called from any
// thread.
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/subprocess.h"

namespace pdserve::testing {

// True if `pid` names a live process (a zombie, dead but not yet reaped, counts as gone).
bool ProcessAlive(pid_t pid);
// Direct children of `pid`, read from /proc/<pid>/task/*/children (empty if `pid` is gone).
std::vector<pid_t> ChildrenOf(pid_t pid);
// The file /proc/<pid>/<name> as a string ("" if unreadable), e.g. "cmdline" (NUL-separated).
std::string ProcFile(pid_t pid, const std::string& name);
// A memory figure of /proc/<pid>/status in KiB (field "VmRSS:", "VmHWM:", ...), or -1.
long ProcStatusKib(pid_t pid, const std::string& field);
// The same once the process's start-up has settled: polls until four reads 100 ms apart agree,
// for up to 10 s. A node's "ready" line can come while its threads are still starting and
// touching memory (under TSan on a loaded machine, up to ~58 MiB of VmHWM came after it),
// which a growth measured from there would count.
long SettledStatusKib(pid_t pid, const std::string& field);
// Polls until none of `pids` is alive; false if one still is at the deadline.
bool WaitAllGone(const std::vector<pid_t>& pids, Deadline deadline);

// Removes the region files libfabric's shm provider names after `pid` (/dev/shm/PID:UID:N, one
// per endpoint; docs/fabric.md), which a process killed with SIGKILL leaves behind. Call it only
// while `pid` cannot be another process: alive, or dead but not yet reaped. Returns how many.
int RemoveShmRegionsOf(pid_t pid);

// How a command run by RunToCompletion ended.
struct CommandRun {
  bool finished = false;  // false: it did not end by the deadline (it was killed) or never started
  ExitStatus exit;
  std::string output;  // stdout, and stderr with it unless CommandOptions::separate_stderr
  std::string errors;  // stderr, with CommandOptions::separate_stderr
};
struct CommandOptions {
  // Variables set on top of this process's environment.
  std::vector<std::pair<std::string, std::string>> env;
  // stderr kept apart (through a temporary file) in CommandRun::errors, e.g. for a command
  // whose stdout is JSON and whose log goes to stderr.
  bool separate_stderr = false;
};
// Runs `argv` (argv[0] a path or a name in PATH) with stdin from /dev/null until it exits or
// `deadline` passes (then kills it).
CommandRun RunToCompletion(const std::vector<std::string>& argv, Deadline deadline,
                           const CommandOptions& options = {});
// RunToCompletion of the built pdserve binary with `args`.
CommandRun RunPdserve(const std::vector<std::string>& args, Deadline deadline,
                      const CommandOptions& options = {});

}  // namespace pdserve::testing
