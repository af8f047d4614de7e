// Test helpers for the fabric tests: a child process driven by line commands over pipes
// (fabric_test_peer, possibly inside `ip netns exec`), and a file-backed shared buffer both
// processes map. Single-threaded use from the test body.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "common/subprocess.h"

namespace pdserve::fabric::testing {

// Path of the fabric_test_peer binary (set by CMake).
std::string PeerBinary();

class PeerProcess {
 public:
  PeerProcess() = default;
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;
  // Destruction kills the child if still running (Kill).
  ~PeerProcess() { Kill(); }

  Status Start(const std::vector<std::string>& argv);
  // Sends `line` and returns the text after "ok" of the reply; an "error ..." reply or a
  // missed deadline is an error. Event lines read meanwhile are kept for WaitEvent.
  Result<std::string> Command(const std::string& line, Deadline deadline);
  // Returns the first event line starting with `prefix` (without it).
  Result<std::string> WaitEvent(const std::string& prefix, Deadline deadline);
  // Kills the child and removes the shm region files it would leave.
  void Kill();
  pid_t pid() const { return process_ ? process_->pid() : -1; }

 private:
  std::optional<Subprocess> process_;
  std::deque<std::string> events_;
};

// A file in /dev/shm of `bytes` bytes, mapped shared; removed on destruction.
class SharedFile {
 public:
  explicit SharedFile(size_t bytes);
  SharedFile(const SharedFile&) = delete;
  SharedFile& operator=(const SharedFile&) = delete;
  ~SharedFile();
  const std::string& path() const { return path_; }
  std::byte* data() { return data_; }
  size_t size() const { return bytes_; }

 private:
  std::string path_;
  size_t bytes_ = 0;
  std::byte* data_ = nullptr;
};

}  // namespace pdserve::fabric::testing
