#include "common/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "common/logging.h"

extern char** environ;

namespace pdserve {
namespace {

// A file descriptor closed on scope exit unless released.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  ~Fd() { Reset(); }
  int get() const { return fd_; }
  int Release() { return std::exchange(fd_, -1); }
  void Reset() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// The executable for argv[0]: itself if it names a path, else the first match in PATH.
Result<std::string> ResolveProgram(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::string_view dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  while (true) {
    const size_t colon = dirs.find(':');
    std::string dir(dirs.substr(0, colon));
    if (dir.empty()) dir = ".";
    const std::string candidate = dir + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    if (colon == std::string_view::npos) break;
    dirs.remove_prefix(colon + 1);
  }
  return Status::InvalidArgument("program '" + name + "' not found in PATH");
}

// This process's environment with `overrides` set on top, as "KEY=VALUE" strings.
std::vector<std::string> BuildEnvironment(
    const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const std::string_view key = entry.substr(0, entry.find('='));
    const bool replaced = std::any_of(overrides.begin(), overrides.end(),
                                      [&](const auto& kv) { return kv.first == key; });
    if (!replaced) env.emplace_back(entry);
  }
  for (const auto& [key, value] : overrides) env.push_back(key + "=" + value);
  return env;
}

std::vector<char*> CStrings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

Result<Fd> OpenForChild(const std::string& path, int flags) {
  const int fd = open(path.c_str(), flags | O_CLOEXEC, 0644);
  if (fd < 0) return Status::FromErrno("open " + path, errno);
  return Fd(fd);
}

// Child side, between fork and exec: async-signal-safe calls only.
void MoveFd(int fd, int target) {
  if (fd < 0) return;
  if (fd == target) {
    fcntl(fd, F_SETFD, 0);  // dup2 onto itself would keep FD_CLOEXEC
  } else {
    dup2(fd, target);
  }
}

int PollTimeoutMs(Deadline deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline.Remaining()).count();
  // Round up so a sub-millisecond remainder still waits; cap so Never() fits an int.
  return static_cast<int>(std::min<int64_t>(left + 1, 1000));
}

}  // namespace

std::string ExitStatus::ToString() const {
  if (signal != 0) return "killed by signal " + std::to_string(signal);
  return "exited with " + std::to_string(code);
}

Result<Subprocess> Subprocess::Spawn(const SubprocessOptions& options) {
  if (options.argv.empty()) return Status::InvalidArgument("Subprocess: empty argv");
  if (options.stdin_mode == StdStream::kFile) {
    return Status::InvalidArgument("Subprocess: stdin from a file is not supported");
  }
  // Everything the child touches is prepared here, before fork.
  PD_ASSIGN_OR_RETURN(std::string program, ResolveProgram(options.argv[0]));
  std::vector<std::string> argv_strings = options.argv;
  std::vector<char*> argv = CStrings(argv_strings);
  std::vector<std::string> env_strings = BuildEnvironment(options.env);
  std::vector<char*> envp = CStrings(env_strings);
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (int cpu : options.cpus) {
    if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(cpu, &cpus);
  }
  const bool pin = !options.cpus.empty();
  sigset_t no_signals;
  sigemptyset(&no_signals);
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  const pid_t parent = getpid();

  // Child ends of the streams (closed here after fork) and the parent's ends.
  Fd child_in, child_out, child_err, parent_in, parent_out;
  if (options.stdin_mode == StdStream::kPipe) {
    // A socket pair rather than a pipe: send(MSG_NOSIGNAL) reports a vanished reader as EPIPE
    // instead of raising SIGPIPE in this process.
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
      return Status::FromErrno("socketpair", errno);
    }
    parent_in = Fd(sv[0]);
    child_in = Fd(sv[1]);
  } else if (options.stdin_mode == StdStream::kNull) {
    PD_ASSIGN_OR_RETURN(child_in, OpenForChild("/dev/null", O_RDONLY));
  }
  if (options.stdout_mode == StdStream::kPipe || options.stderr_mode == StdStream::kPipe) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return Status::FromErrno("pipe2", errno);
    parent_out = Fd(fds[0]);
    Fd write_end(fds[1]);
    if (options.stdout_mode == StdStream::kPipe && options.stderr_mode == StdStream::kPipe) {
      const int dup = fcntl(write_end.get(), F_DUPFD_CLOEXEC, 0);
      if (dup < 0) return Status::FromErrno("fcntl F_DUPFD_CLOEXEC", errno);
      child_err = Fd(dup);
      child_out = std::move(write_end);
    } else if (options.stdout_mode == StdStream::kPipe) {
      child_out = std::move(write_end);
    } else {
      child_err = std::move(write_end);
    }
  }
  const int write_flags = O_WRONLY | O_CREAT | O_TRUNC;
  if (options.stdout_mode == StdStream::kNull) {
    PD_ASSIGN_OR_RETURN(child_out, OpenForChild("/dev/null", O_WRONLY));
  } else if (options.stdout_mode == StdStream::kFile) {
    PD_ASSIGN_OR_RETURN(child_out, OpenForChild(options.stdout_path, write_flags));
  }
  if (options.stderr_mode == StdStream::kNull) {
    PD_ASSIGN_OR_RETURN(child_err, OpenForChild("/dev/null", O_WRONLY));
  } else if (options.stderr_mode == StdStream::kFile) {
    PD_ASSIGN_OR_RETURN(child_err, OpenForChild(options.stderr_path, write_flags));
  }

  const pid_t pid = fork();
  if (pid < 0) return Status::FromErrno("fork", errno);
  if (pid == 0) {
    if (options.new_process_group) setpgid(0, 0);
    if (options.kill_with_parent) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);  // the parent died before prctl took effect
    }
    if (pin) sched_setaffinity(0, sizeof(cpus), &cpus);
    // Before unblocking: a signal pending since before fork is then discarded, not delivered.
    for (int sig : options.ignored_signals) sigaction(sig, &ignore, nullptr);
    if (options.unblock_signals) sigprocmask(SIG_SETMASK, &no_signals, nullptr);
    MoveFd(child_in.get(), STDIN_FILENO);
    MoveFd(child_out.get(), STDOUT_FILENO);
    MoveFd(child_err.get(), STDERR_FILENO);
    for (int fd : options.inherit_fds) fcntl(fd, F_SETFD, 0);
    execve(program.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  // Also from the parent, so the group exists before any Signal(sig, true).
  if (options.new_process_group) setpgid(pid, pid);
  Subprocess process;
  process.pid_ = pid;
  process.own_group_ = options.new_process_group;
  process.stdin_fd_ = parent_in.Release();
  process.stdout_fd_ = parent_out.Release();
  return process;
}

Subprocess::Subprocess(Subprocess&& other) noexcept { *this = std::move(other); }

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  if (this != &other) {
    Reset();
    pid_ = std::exchange(other.pid_, -1);
    own_group_ = other.own_group_;
    reaped_ = other.reaped_;
    exit_status_ = other.exit_status_;
    stdin_fd_ = std::exchange(other.stdin_fd_, -1);
    stdout_fd_ = std::exchange(other.stdout_fd_, -1);
    buffer_ = std::move(other.buffer_);
    stdout_eof_ = other.stdout_eof_;
  }
  return *this;
}

Subprocess::~Subprocess() { Reset(); }

void Subprocess::Reset() {
  Kill();
  CloseStdin();
  if (stdout_fd_ >= 0) close(stdout_fd_);
  stdout_fd_ = -1;
  pid_ = -1;
  reaped_ = false;
  buffer_.clear();
  stdout_eof_ = false;
}

Status Subprocess::Signal(int sig, bool group) {
  if (!running()) return Status::FailedPrecondition("Subprocess: no running child to signal");
  if (group && !own_group_) {
    return Status::FailedPrecondition("Subprocess: child has no process group of its own");
  }
  if (kill(group ? -pid_ : pid_, sig) != 0) return Status::FromErrno("kill", errno);
  return Status::Ok();
}

std::optional<ExitStatus> Subprocess::TryWait() {
  if (pid_ <= 0) return std::nullopt;
  if (reaped_) return exit_status_;
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == 0) return std::nullopt;
  reaped_ = true;
  if (r < 0) {
    // ECHILD: someone else reaped it (SIGCHLD ignored, or a stray waitpid(-1)).
    exit_status_ = ExitStatus{.code = -1, .signal = 0};
  } else if (WIFEXITED(status)) {
    exit_status_ = ExitStatus{.code = WEXITSTATUS(status), .signal = 0};
  } else {
    exit_status_ = ExitStatus{.code = -1, .signal = WTERMSIG(status)};
  }
  return exit_status_;
}

Result<ExitStatus> Subprocess::WaitFor(Deadline deadline) {
  if (pid_ <= 0) return Status::FailedPrecondition("Subprocess: no child");
  auto sleep = std::chrono::microseconds(500);
  while (true) {
    if (std::optional<ExitStatus> status = TryWait()) return *status;
    if (deadline.Passed()) {
      return Status::DeadlineExceeded("process " + std::to_string(pid_) + " still running");
    }
    // Short sleeps first (most waits end quickly), backing off to 20 ms.
    std::this_thread::sleep_for(std::min<Duration>(sleep, deadline.Remaining()));
    sleep = std::min(sleep * 2, std::chrono::microseconds(20000));
  }
}

void Subprocess::Kill() {
  if (!running()) return;
  if (own_group_) kill(-pid_, SIGKILL);
  kill(pid_, SIGKILL);
  // SIGKILL cannot be caught; only a process stuck in the kernel outlives 10 s.
  if (!WaitFor(Deadline::AfterMs(10000)).ok()) {
    PD_LOG_WARN("process {} survived SIGKILL for 10 s; leaving it unreaped", pid_);
  }
}

Status Subprocess::WriteStdin(std::string_view bytes, Deadline deadline) {
  if (stdin_fd_ < 0) return Status::FailedPrecondition("Subprocess: stdin is not a pipe");
  while (!bytes.empty()) {
    const ssize_t n = send(stdin_fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      bytes.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return Status::FromErrno("write to child", errno);
    if (deadline.Passed()) return Status::DeadlineExceeded("child does not read its stdin");
    pollfd p{stdin_fd_, POLLOUT, 0};
    poll(&p, 1, PollTimeoutMs(deadline));
  }
  return Status::Ok();
}

void Subprocess::CloseStdin() {
  if (stdin_fd_ >= 0) close(stdin_fd_);
  stdin_fd_ = -1;
}

Result<bool> Subprocess::ReadChunk(Deadline deadline) {
  if (stdout_fd_ < 0) return Status::FailedPrecondition("Subprocess: stdout is not a pipe");
  while (true) {
    pollfd p{stdout_fd_, POLLIN, 0};
    const int rc = poll(&p, 1, PollTimeoutMs(deadline));
    if (rc < 0 && errno != EINTR) return Status::FromErrno("poll", errno);
    if (rc > 0) {
      char chunk[4096];
      const ssize_t n = read(stdout_fd_, chunk, sizeof(chunk));
      if (n == 0) {
        stdout_eof_ = true;
        return false;
      }
      if (n > 0) {
        buffer_.append(chunk, static_cast<size_t>(n));
        return true;
      }
      if (errno != EINTR && errno != EAGAIN) return Status::FromErrno("read from child", errno);
    }
    if (deadline.Passed()) return Status::DeadlineExceeded("child wrote nothing in time");
  }
}

Result<std::string> Subprocess::ReadLine(Deadline deadline) {
  while (true) {
    if (const size_t nl = buffer_.find('\n'); nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    if (stdout_eof_) {
      if (buffer_.empty()) return Status::Unavailable("child closed its output (exited?)");
      return std::exchange(buffer_, std::string());
    }
    PD_RETURN_IF_ERROR(ReadChunk(deadline).status());
  }
}

Result<std::string> Subprocess::ReadAll(Deadline deadline) {
  while (!stdout_eof_) PD_RETURN_IF_ERROR(ReadChunk(deadline).status());
  return std::exchange(buffer_, std::string());
}

}  // namespace pdserve
