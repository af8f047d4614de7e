#include "http/lingering_close.h"

#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdlib>

namespace pdserve::http {
namespace {

int PortOf(const sockaddr_storage& addr) {
  if (addr.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port);
  }
  if (addr.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port);
  }
  return -1;
}

}  // namespace

int FindConnectedSocket(int local_port, int remote_port) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (dirent* e = readdir(dir)) {
    const int fd = std::atoi(e->d_name);
    if (fd <= 2 || fd == dirfd(dir)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t llen = sizeof(local), plen = sizeof(peer);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) != 0 ||
        PortOf(local) != local_port) {
      continue;
    }
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) == 0 &&
        PortOf(peer) == remote_port) {
      found = fd;
      break;
    }
  }
  closedir(dir);
  return found;
}

void DrainBeforeClose(int fd, const LingerLimits& limits) {
  const Deadline end = Deadline::After(limits.total);
  uint64_t drained = 0;
  char buf[16384];
  while (drained < limits.max_bytes && !end.Passed()) {
    const auto wait =
        std::min(limits.idle, std::chrono::duration_cast<Duration>(end.at() - Clock::now()));
    pollfd p{fd, POLLIN, 0};
    const int ms = static_cast<int>(
        std::max<int64_t>(1, std::chrono::duration_cast<std::chrono::milliseconds>(wait).count()));
    if (poll(&p, 1, ms) <= 0) return;  // paused (or failed): done
    const ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n <= 0) return;  // closed by the client, or reset
    drained += static_cast<uint64_t>(n);
  }
}

}  // namespace pdserve::http
