// Subprocess: one child process started from an argv, owned like a handle. It is reaped exactly
// once, and a child still running when its Subprocess is destroyed is killed (SIGKILL, to its
// process group if it has its own) and reaped, so no test or command leaves one behind.
//
// Spawning is safe from a multi-threaded process: every array the child needs (argv, envp, the
// resolved executable path, the CPU set) is built before fork, and the child makes only
// async-signal-safe calls before exec. Thread-compatible: use one object from one thread at a
// time (different objects from different threads are fine). With kill_with_parent, the child
// dies when the *thread* that spawned it exits (PR_SET_PDEATHSIG), so spawn from a thread that
// outlives the child, e.g. main().
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/status.h"

namespace pdserve {

// Where one of the child's standard streams goes.
enum class StdStream : uint8_t {
  kInherit,  // this process's stream
  kPipe,     // a pipe this object owns: stdin for WriteStdin; stdout and stderr share one
             // pipe for ReadLine / ReadAll (stderr: kPipe is 2>&1)
  kNull,     // /dev/null
  kFile,     // the file at SubprocessOptions::stdout_path / stderr_path (created or truncated)
};

struct SubprocessOptions {
  // argv[0] is the program: a path, or a bare name looked up in PATH.
  std::vector<std::string> argv;
  // Set (or replace) these variables on top of this process's environment.
  std::vector<std::pair<std::string, std::string>> env;
  StdStream stdin_mode = StdStream::kInherit;  // kPipe or kNull or kInherit
  StdStream stdout_mode = StdStream::kInherit;
  StdStream stderr_mode = StdStream::kInherit;
  std::string stdout_path, stderr_path;  // for kFile
  // Its own process group (pgid = pid): Signal(sig, true) then reaches its children too.
  bool new_process_group = false;
  // SIGKILL the child when the spawning thread exits (see the header comment).
  bool kill_with_parent = false;
  // Pin the child to these CPUs (empty: inherit this process's affinity).
  std::vector<int> cpus;
  // Descriptors of this process the child keeps across exec under the same numbers (their
  // close-on-exec flag is cleared in the child only), e.g. shared-memory regions.
  std::vector<int> inherit_fds;
  // Start the child with no signal blocked (a parent that blocks SIGTERM to sigwait for it
  // would otherwise pass the mask on).
  bool unblock_signals = true;
  // Signals the child starts with ignored (SIG_IGN survives exec), from before its first
  // instruction: e.g. a helper that its parent, not a terminal's Ctrl-C, should stop.
  std::vector<int> ignored_signals;
};

// How a child ended: an exit code, or the signal that killed it. code -1 with signal 0 means
// the status was lost (something else reaped the child, e.g. with SIGCHLD ignored).
struct ExitStatus {
  int code = -1;   // exit code when it exited; -1 if a signal killed it
  int signal = 0;  // the terminating signal; 0 if it exited
  bool exited() const { return signal == 0; }
  bool success() const { return signal == 0 && code == 0; }
  std::string ToString() const;  // "exited with 3", "killed by signal 9"
};

class Subprocess {
 public:
  // Starts the child. InvalidArgument for an empty argv or a program not found; an errno
  // status if a pipe, file or fork fails. A program that exists but cannot be executed makes
  // the child exit with 127.
  static Result<Subprocess> Spawn(const SubprocessOptions& options);

  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  ~Subprocess();  // Kill() if still running, then closes the pipes

  pid_t pid() const { return pid_; }
  // True until the child has been reaped by TryWait/WaitFor/Kill.
  bool running() const { return pid_ > 0 && !reaped_; }

  // Sends `sig` to the child, or to its process group when `group` (needs new_process_group).
  // Does nothing once the child has been reaped (its pid may belong to another process).
  Status Signal(int sig, bool group = false);
  // Reaps the child if it has ended; never blocks.
  std::optional<ExitStatus> TryWait();
  // Waits until the child ends or `deadline` passes (DeadlineExceeded; it keeps running).
  Result<ExitStatus> WaitFor(Deadline deadline);
  // SIGKILL (the group too, if it has its own) and reap; bounded by 10 s.
  void Kill();

  // --- with stdin_mode = kPipe ---
  // Writes all of `bytes` (waiting while the child does not read, up to `deadline`). A child
  // that has closed its stdin gives an error status, never SIGPIPE.
  Status WriteStdin(std::string_view bytes, Deadline deadline);
  void CloseStdin();  // the child reads EOF
  // --- with stdout_mode = kPipe ---
  // The next line of stdout without its '\n'. At EOF: the unterminated rest if any, else
  // Unavailable. DeadlineExceeded when no full line came in time (what came stays buffered).
  Result<std::string> ReadLine(Deadline deadline);
  // Everything until EOF (the child closed stdout, usually by exiting) or the deadline.
  // DeadlineExceeded keeps what was read buffered for the next call.
  Result<std::string> ReadAll(Deadline deadline);

 private:
  Subprocess() = default;
  // Reads one chunk into buffer_ within the deadline; false at EOF.
  Result<bool> ReadChunk(Deadline deadline);
  void Reset();

  pid_t pid_ = -1;
  bool own_group_ = false;
  bool reaped_ = false;
  ExitStatus exit_status_;
  int stdin_fd_ = -1;
  int stdout_fd_ = -1;
  std::string buffer_;  // stdout read but not yet returned
  bool stdout_eof_ = false;
};

}  // namespace pdserve
