#include "http/lingering_close.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdlib>

namespace pdserve::http {

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
