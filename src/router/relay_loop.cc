#include "router/relay_loop.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <future>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "common/logging.h"
#include "http/sse.h"

namespace pdserve::router {
namespace {

constexpr uint64_t kWakeKey = 0;  // epoll key of the eventfd; streams' keys are id * 2 + side
constexpr int kMaxEvents = 64;
constexpr auto kDeadlineCheckInterval = std::chrono::seconds(1);

// The start of an SSE event that reports an error (http::SseError's shape).
constexpr std::string_view kSseErrorStart = "data: {\"error\"";

// Whether `events` (whole SSE events) hold one that reports an error.
bool HasErrorEvent(std::string_view events) {
  for (size_t at = 0; at < events.size();) {
    if (events.substr(at).starts_with(kSseErrorStart)) return true;
    const size_t end = events.find("\n\n", at);
    if (end == std::string_view::npos) break;
    at = end + 2;
  }
  return false;
}

int64_t ToSeconds(Duration d) {
  return std::chrono::duration_cast<std::chrono::seconds>(d).count();
}

}  // namespace

struct RelayLoop::Stream {
  UpstreamExchange* exchange = nullptr;
  int client_fd = -1;
  uint64_t id = 0;
  int node_fd = -1;     // the node socket as registered (-1: not in the epoll set)
  bool reading = true;  // waiting for the node (otherwise for room to write to the client)
  std::string piece;    // what the node sent last
  std::string pending;  // the start of an event still arriving
  std::string out;      // chunks not yet taken by the client, from out_sent on
  size_t out_sent = 0;
  bool closing = false;  // the node's part is over: end with `closing_reason` once out is sent
  RelayEnd::Reason closing_reason = RelayEnd::Reason::kComplete;
  TimePoint last_from_node;
  TimePoint stalled_since;  // when out stopped draining
  RelayEnd end;
  std::promise<void> done;
};

Result<std::unique_ptr<RelayLoop>> RelayLoop::Start(RelayOptions options) {
  std::unique_ptr<RelayLoop> loop(new RelayLoop(options));
  loop->epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  loop->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeKey;
  if (loop->epoll_fd_ < 0 || loop->wake_fd_ < 0 ||
      epoll_ctl(loop->epoll_fd_, EPOLL_CTL_ADD, loop->wake_fd_, &ev) != 0) {
    return Status::Internal(std::string("starting the relay loop: ") + std::strerror(errno));
  }
  loop->thread_ = std::thread([raw = loop.get()] { raw->Run(); });
  return loop;
}

RelayLoop::~RelayLoop() {
  if (thread_.joinable()) {
    AbortAll();
    thread_.join();
  }
  if (wake_fd_ >= 0) ::close(wake_fd_);
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
}

void RelayLoop::AbortAll() {
  {
    MutexLock lock(&mu_);
    if (aborted_.exchange(true)) return;
  }
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

RelayEnd RelayLoop::Relay(UpstreamExchange& exchange, int client_fd) {
  auto stream = std::make_shared<Stream>();
  stream->exchange = &exchange;
  stream->client_fd = client_fd;
  std::future<void> done = stream->done.get_future();
  {
    MutexLock lock(&mu_);
    if (aborted_.load()) {
      RelayEnd aborted;
      aborted.reason = RelayEnd::Reason::kAborted;
      return aborted;
    }
    queued_.push_back(stream);
  }
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  done.wait();
  return std::move(stream->end);
}

void RelayLoop::Run() {
  epoll_event events[kMaxEvents];
  TimePoint next_check = Clock::now() + kDeadlineCheckInterval;
  for (;;) {
    const int timeout_ms = streams_.empty() ? -1 : 1000;
    const int n = epoll_wait(epoll_fd_, events, kMaxEvents, timeout_ms);
    if (n < 0 && errno != EINTR) {
      PD_LOG_ERROR("relay loop: epoll_wait: {}", std::strerror(errno));
      AbortAll();
    }
    for (int i = 0; i < n; ++i) {
      const uint64_t key = events[i].data.u64;
      if (key == kWakeKey) {
        uint64_t count;
        (void)!read(wake_fd_, &count, sizeof(count));
        continue;  // the queue is looked at below, after every wait
      }
      auto it = streams_.find(key / 2);
      if (it == streams_.end()) continue;  // ended by an earlier event of this wait
      const std::shared_ptr<Stream> s = it->second;
      if (key % 2 == 1) {
        if ((events[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0) {
          End(*s, RelayEnd::Reason::kClientGone, "the client closed the connection");
        } else {
          Flush(*s);
        }
      } else {
        Pump(*s);
      }
    }
    AdoptQueued();
    if (aborted_.load()) {
      // Once aborted, Relay queues nothing more; what it queued before is taken (and ended)
      // here, even if the adoption above ran just before it.
      AdoptQueued();
      if (streams_.empty()) return;
    }
    if (Clock::now() >= next_check) {
      CheckDeadlines();
      next_check = Clock::now() + kDeadlineCheckInterval;
    }
  }
}

void RelayLoop::AdoptQueued() {
  std::deque<std::shared_ptr<Stream>> adopted;
  {
    MutexLock lock(&mu_);
    adopted.swap(queued_);
  }
  for (std::shared_ptr<Stream>& s : adopted) {
    s->id = next_id_++;
    s->last_from_node = Clock::now();
    streams_.emplace(s->id, s);
    epoll_event ev{};
    ev.events = EPOLLRDHUP;
    ev.data.u64 = s->id * 2 + 1;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, s->client_fd, &ev) != 0) {
      End(*s, RelayEnd::Reason::kClientGone,
          std::string("watching the client: ") + std::strerror(errno));
      continue;
    }
    Watch(*s, /*reading=*/true);
    // What came with the response head is read already: no readiness will announce it.
    Pump(*s);
  }
  if (aborted_.load()) {
    while (!streams_.empty()) End(*streams_.begin()->second, RelayEnd::Reason::kAborted);
  }
}

void RelayLoop::Watch(Stream& s, bool reading) {
  s.reading = reading;
  // The node socket leaves the set while the client catches up: watched without EPOLLIN, a
  // node that closes would report EPOLLHUP without end.
  if (reading && s.node_fd < 0 && s.exchange->socket() >= 0) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = s.id * 2;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, s.exchange->socket(), &ev) == 0) {
      s.node_fd = s.exchange->socket();
    }
  } else if (!reading && s.node_fd >= 0) {
    (void)epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, s.node_fd, nullptr);
    s.node_fd = -1;
  }
  epoll_event ev{};
  ev.events = EPOLLRDHUP | (reading ? 0u : static_cast<uint32_t>(EPOLLOUT));
  ev.data.u64 = s.id * 2 + 1;
  (void)epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, s.client_fd, &ev);
}

void RelayLoop::Pump(Stream& s) {
  for (bool more = true; more;) {
    more = false;
    switch (s.exchange->PopReady(&s.piece)) {
      case UpstreamExchange::Next::kData: {
        s.last_from_node = Clock::now();
        // Whole events only. The usual piece is one or more whole events (the chunks the node
        // wrote): they go out as they came.
        std::string_view events = s.piece;
        if (!s.pending.empty() || !s.piece.ends_with("\n\n")) {
          s.pending += s.piece;
          const size_t end = s.pending.rfind("\n\n");
          more = true;
          if (end == std::string::npos) break;
          s.piece.assign(s.pending, 0, end + 2);
          s.pending.erase(0, end + 2);
          events = s.piece;
        }
        more = true;
        s.end.bytes += events.size();
        s.end.upstream_error = s.end.upstream_error || HasErrorEvent(events);
        s.end.saw_done = s.end.saw_done || events.find(http::kSseDone) != std::string::npos;
        fmt::format_to(std::back_inserter(s.out), "{:x}\r\n", events.size());
        s.out.append(events) += "\r\n";
        break;
      }
      case UpstreamExchange::Next::kEnd:
        // A last event without its blank line goes out as the node sent it.
        if (!s.pending.empty()) {
          s.end.bytes += s.pending.size();
          fmt::format_to(std::back_inserter(s.out), "{:x}\r\n", s.pending.size());
          s.out.append(s.pending) += "\r\n";
          s.pending.clear();
        }
        s.closing = true;
        s.closing_reason = RelayEnd::Reason::kComplete;
        break;
      case UpstreamExchange::Next::kError:
        s.closing = true;
        s.closing_reason = RelayEnd::Reason::kUpstreamBroken;
        s.end.detail = s.piece;
        break;
      case UpstreamExchange::Next::kTimeout:
        break;
    }
    // One read per readiness (the epoll set is level-triggered): after a piece, only what
    // that read left, or the body's end, is taken at once.
    more = more && !s.closing && s.exchange->holds_unread();
  }
  if (s.closing && s.node_fd >= 0) {
    // The node socket went back to the idle connections or was closed: not ours to watch.
    (void)epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, s.node_fd, nullptr);
    s.node_fd = -1;
  }
  Flush(s);
}

void RelayLoop::Flush(Stream& s) {
  while (s.out_sent < s.out.size()) {
    const ssize_t n = send(s.client_fd, s.out.data() + s.out_sent, s.out.size() - s.out_sent,
                           MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      s.out_sent += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      break;
    } else {
      End(s, RelayEnd::Reason::kClientGone,
          std::string("writing to the client: ") + std::strerror(errno));
      return;
    }
  }
  if (s.out_sent < s.out.size()) {
    if (s.reading || s.closing) {
      s.stalled_since = Clock::now();
      Watch(s, /*reading=*/false);
    }
    return;
  }
  s.out.clear();
  s.out_sent = 0;
  if (s.closing) {
    End(s, s.closing_reason, std::move(s.end.detail));
  } else if (!s.reading) {
    Watch(s, /*reading=*/true);
  }
}

void RelayLoop::End(Stream& s, RelayEnd::Reason reason, std::string detail) {
  if (s.node_fd >= 0) (void)epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, s.node_fd, nullptr);
  (void)epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, s.client_fd, nullptr);
  s.node_fd = -1;
  s.end.reason = reason;
  s.end.detail = std::move(detail);
  const auto it = streams_.find(s.id);
  const std::shared_ptr<Stream> keep = it == streams_.end() ? nullptr : it->second;
  if (it != streams_.end()) streams_.erase(it);
  s.done.set_value();  // the handler thread owns the exchange and the socket again
}

void RelayLoop::CheckDeadlines() {
  const TimePoint now = Clock::now();
  std::vector<std::shared_ptr<Stream>> late;
  for (const auto& [id, s] : streams_) {
    if ((s->reading && now - s->last_from_node > options_.silence) ||
        (!s->reading && now - s->stalled_since > options_.client_stall)) {
      late.push_back(s);
    }
  }
  for (const std::shared_ptr<Stream>& s : late) {
    if (s->reading) {
      End(*s, RelayEnd::Reason::kUpstreamSilent,
          fmt::format("no data from the node for {} s", ToSeconds(options_.silence)));
    } else {
      End(*s, RelayEnd::Reason::kClientGone,
          fmt::format("the client read nothing for {} s", ToSeconds(options_.client_stall)));
    }
  }
}

}  // namespace pdserve::router
