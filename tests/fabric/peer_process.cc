#include "peer_process.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>

#include <fmt/format.h>

#include "testing/processes.h"

namespace pdserve::fabric::testing {

std::string PeerBinary() { return FABRIC_TEST_PEER_PATH; }

Status PeerProcess::Start(const std::vector<std::string>& argv) {
  SubprocessOptions options;
  options.argv = argv;
  options.stdin_mode = StdStream::kPipe;
  options.stdout_mode = StdStream::kPipe;
  PD_ASSIGN_OR_RETURN(Subprocess process, Subprocess::Spawn(options));
  process_ = std::move(process);
  return Status::Ok();
}

void PeerProcess::Kill() {
  // Alive or unreaped: its pid is still its own (testing/processes.h).
  if (process_ && process_->running()) pdserve::testing::RemoveShmRegionsOf(process_->pid());
  process_.reset();
}

Result<std::string> PeerProcess::Command(const std::string& line, Deadline deadline) {
  if (!process_) return Status::FailedPrecondition("peer process not started");
  PD_RETURN_IF_ERROR(process_->WriteStdin(line + "\n", deadline));
  while (true) {
    PD_ASSIGN_OR_RETURN(std::string reply, process_->ReadLine(deadline));
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
    if (!process_) return Status::FailedPrecondition("peer process not started");
    PD_ASSIGN_OR_RETURN(std::string line, process_->ReadLine(deadline));
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
