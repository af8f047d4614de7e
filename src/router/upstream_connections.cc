#include "router/upstream_connections.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

namespace pdserve::router {
namespace {

// A margin under the node's keep-alive timeout (at most half of it): a request sent on a
// connection the node is about to close would fail (and go out again on a new one,
// router/router_upstream.h).
constexpr Duration kNodeTimeoutMargin = std::chrono::seconds(1);

// Whether the idle connection `fd` is still usable: open at the node's end and with nothing
// unread (an idle connection has no answer pending). Does not block.
bool IdleConnectionUsable(int fd) {
  char byte;
  const ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

}  // namespace

UpstreamConnections::UpstreamConnections(UpstreamConnectionOptions options) : options_(options) {}

UpstreamConnections::~UpstreamConnections() {
  MutexLock lock(&mu_);
  for (auto& [url, list] : idle_) {
    for (const Idle& idle : list) ::close(idle.fd);
  }
}

int UpstreamConnections::Take(const std::string& url) {
  const TimePoint now = Clock::now();
  std::vector<int> stale;
  int fd = -1;
  {
    MutexLock lock(&mu_);
    auto it = idle_.find(url);
    if (it == idle_.end()) return -1;
    std::vector<Idle>& list = it->second;
    while (!list.empty() && fd < 0) {
      const Idle idle = list.back();
      list.pop_back();
      if (idle.expires > now && IdleConnectionUsable(idle.fd)) {
        fd = idle.fd;
      } else {
        stale.push_back(idle.fd);
      }
    }
  }
  for (int s : stale) ::close(s);
  if (fd >= 0) reused_.fetch_add(1, std::memory_order_relaxed);
  return fd;
}

void UpstreamConnections::Put(const std::string& url, int fd, Duration node_timeout) {
  Duration keep = options_.idle_timeout;
  if (node_timeout > Duration::zero()) {
    keep = std::min(keep, node_timeout - std::min(kNodeTimeoutMargin, node_timeout / 2));
  }
  if (keep <= Duration::zero()) {
    ::close(fd);
    return;
  }
  {
    MutexLock lock(&mu_);
    std::vector<Idle>& list = idle_[url];
    if (list.size() < options_.max_idle_per_node) {
      list.push_back({fd, Clock::now() + keep});
      return;
    }
  }
  ::close(fd);
}

void UpstreamConnections::CloseStale() {
  const TimePoint now = Clock::now();
  std::vector<int> stale;
  {
    MutexLock lock(&mu_);
    for (auto it = idle_.begin(); it != idle_.end();) {
      std::vector<Idle>& list = it->second;
      auto keep_end = std::stable_partition(list.begin(), list.end(), [&](const Idle& idle) {
        return idle.expires > now && IdleConnectionUsable(idle.fd);
      });
      for (auto s = keep_end; s != list.end(); ++s) stale.push_back(s->fd);
      list.erase(keep_end, list.end());
      // Nodes come and go (registrations expire): drop their empty entries too.
      it = list.empty() ? idle_.erase(it) : std::next(it);
    }
  }
  for (int s : stale) ::close(s);
}

UpstreamConnectionStats UpstreamConnections::stats() const {
  UpstreamConnectionStats s;
  s.opened = opened_.load(std::memory_order_relaxed);
  s.reused = reused_.load(std::memory_order_relaxed);
  MutexLock lock(&mu_);
  for (const auto& [url, list] : idle_) s.idle += list.size();
  return s;
}

}  // namespace pdserve::router
