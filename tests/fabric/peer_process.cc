#include "peer_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace pdserve::fabric::testing {

std::string PeerBinary() { return FABRIC_TEST_PEER_PATH; }

PeerProcess::~PeerProcess() { Kill(); }

Status PeerProcess::Start(const std::vector<std::string>& argv) {
  int in_pipe[2], out_pipe[2];
  if (pipe2(in_pipe, O_CLOEXEC) != 0 || pipe2(out_pipe, O_CLOEXEC) != 0) {
    return Status::FromErrno("pipe2", errno);
  }
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_ = fork();
  if (pid_ < 0) return Status::FromErrno("fork", errno);
  if (pid_ == 0) {
    dup2(in_pipe[0], STDIN_FILENO);
    dup2(out_pipe[1], STDOUT_FILENO);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(in_pipe[0]);
  close(out_pipe[1]);
  to_child_ = in_pipe[1];
  from_child_ = out_pipe[0];
  return Status::Ok();
}

void PeerProcess::Kill() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  if (to_child_ >= 0) close(to_child_);
  if (from_child_ >= 0) close(from_child_);
  to_child_ = from_child_ = -1;
}

Result<std::string> PeerProcess::ReadLine(Deadline deadline) {
  while (true) {
    if (size_t nl = buffer_.find('\n'); nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(deadline.Remaining());
    if (remaining.count() <= 0) return Status::DeadlineExceeded("peer process did not answer");
    pollfd p{from_child_, POLLIN, 0};
    int rc = poll(&p, 1, static_cast<int>(remaining.count()) + 1);
    if (rc < 0 && errno != EINTR) return Status::FromErrno("poll", errno);
    if (rc <= 0) continue;
    char chunk[4096];
    ssize_t n = read(from_child_, chunk, sizeof chunk);
    if (n == 0) return Status::Unavailable("peer process closed its output (exited?)");
    if (n < 0 && errno != EINTR) return Status::FromErrno("read", errno);
    if (n > 0) buffer_.append(chunk, static_cast<size_t>(n));
  }
}

Result<std::string> PeerProcess::Command(const std::string& line, Deadline deadline) {
  std::string out = line + "\n";
  if (write(to_child_, out.data(), out.size()) != static_cast<ssize_t>(out.size())) {
    return Status::FromErrno("write to peer", errno);
  }
  while (true) {
    PD_ASSIGN_OR_RETURN(std::string reply, ReadLine(deadline));
    if (reply == "ok") return std::string();
    if (reply.rfind("ok ", 0) == 0) return reply.substr(3);
    if (reply.rfind("error", 0) == 0) {
      return Status::Internal(fmt::format("peer answered '{}' to '{}'", reply, line.substr(0, 60)));
    }
    events_.push_back(std::move(reply));
  }
}

Result<std::string> PeerProcess::WaitEvent(const std::string& prefix, Deadline deadline) {
  while (true) {
    for (auto it = events_.begin(); it != events_.end(); ++it) {
      if (it->rfind(prefix, 0) == 0) {
        std::string rest = it->substr(prefix.size());
        events_.erase(it);
        return rest;
      }
    }
    PD_ASSIGN_OR_RETURN(std::string line, ReadLine(deadline));
    events_.push_back(std::move(line));
  }
}

SharedFile::SharedFile(size_t bytes) : bytes_(bytes) {
  static std::atomic<int> counter{0};
  path_ = fmt::format("/dev/shm/pdserve-fabric-test-{}-{}", getpid(), counter.fetch_add(1));
  int fd = open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd >= 0 && ftruncate(fd, static_cast<off_t>(bytes)) == 0) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) data_ = static_cast<std::byte*>(p);
  }
  if (fd >= 0) close(fd);
}

SharedFile::~SharedFile() {
  if (data_ != nullptr) munmap(data_, bytes_);
  unlink(path_.c_str());
}

}  // namespace pdserve::fabric::testing
