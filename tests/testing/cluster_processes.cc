#include "testing/cluster_processes.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <thread>

#include <httplib.h>

#include "testing/test_paths.h"

namespace pdserve::testing {

Subprocess::Subprocess(const std::vector<std::string>& argv, bool with_stderr) {
  SubprocessOptions options;
  options.argv = argv;
  options.stdout_mode = StdStream::kPipe;
  if (with_stderr) options.stderr_mode = StdStream::kPipe;
  options.new_process_group = true;
  if (auto process = ::pdserve::Subprocess::Spawn(options); process.ok()) {
    process_ = std::move(*process);
  }
}

std::optional<std::string> Subprocess::ReadLineContaining(const std::string& needle,
                                                          Deadline deadline) {
  if (!process_) return std::nullopt;
  for (;;) {
    auto line = process_->ReadLine(deadline);
    if (!line.ok()) return std::nullopt;
    if (line->find(needle) != std::string::npos) return *line;
  }
}

void Subprocess::Signal(int signal) {
  if (process_) (void)process_->Signal(signal);
}

std::optional<ExitStatus> Subprocess::Wait(Deadline deadline) {
  if (!process_) return std::nullopt;
  auto status = process_->WaitFor(deadline);
  if (!status.ok()) return std::nullopt;
  return *status;
}

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

bool WaitHealthy(int port, Deadline deadline) {
  while (!deadline.Passed()) {
    httplib::Client client("127.0.0.1", port);
    client.set_connection_timeout(1, 0);
    client.set_read_timeout(2, 0);
    if (auto r = client.Get("/health"); r && r->status == 200) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

}  // namespace pdserve::testing
