#include "http/connection_pool.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "common/check.h"
#include "common/logging.h"
#include "http/request_id.h"

namespace pdserve::http {
namespace {

// A refused connection is read and discarded this long before it closes, so that the client,
// still sending its request, reads the answer instead of a reset (see http/lingering_close.h).
constexpr Duration kRefusalLinger = std::chrono::seconds(2);
// The most bytes the poller reads from one connection per wake-up.
constexpr size_t kPollReadBytes = 64 * 1024;

const char* ReasonPhrase(int status) {
  switch (status) {
    case 400:
      return "Bad Request";
    case 408:
      return "Request Timeout";
    case 413:
      return "Payload Too Large";
    case 431:
      return "Request Header Fields Too Large";
    case 503:
      return "Service Unavailable";
    default:
      return "Error";
  }
}

}  // namespace

std::string RefusalResponse(const ApiError& error) {
  const std::string body = error.ToJson();
  std::string out =
      "HTTP/1.1 " + std::to_string(error.http_status) + " " + ReasonPhrase(error.http_status) +
      "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\n" + kRequestIdHeader + ": " + NewRequestId() + "\r\nConnection: close\r\n";
  if (error.retry_later()) out += "Retry-After: " + std::to_string(error.retry_after_s) + "\r\n";
  return out + "\r\n" + body;
}

std::optional<ApiError> HeadRefusal(const Connection& conn, ScanState state,
                                    size_t max_head_bytes) {
  switch (state) {
    case ScanState::kMalformed:
      return ApiError::MalformedRequest(conn.head_problem());
    case ScanState::kComplete:
      if (conn.framing().head_size > max_head_bytes) return ApiError::HeaderTooLarge();
      return std::nullopt;
    case ScanState::kIncomplete:
      if (conn.pending().size() >= max_head_bytes) return ApiError::HeaderTooLarge();
      return std::nullopt;
  }
  return std::nullopt;
}

void SendRefusal(const Connection& conn, const ApiError& error) {
  const std::string answer = RefusalResponse(error);
  (void)send(conn.fd(), answer.data(), answer.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  ::shutdown(conn.fd(), SHUT_WR);
}

ConnectionPool::ConnectionPool(const ConnectionLimits& limits, ServeFn serve)
    : limits_(limits), serve_(std::move(serve)) {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  // Only at listen start, and httplib's task-queue factory has no way to report a failure.
  PD_CHECK_MSG(epoll_fd_ >= 0 && wake_fd_ >= 0, "epoll_create1/eventfd failed");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  poller_ = std::thread([this] { PollLoop(); });
  for (int i = 0; i < std::max(1, limits_.threads); ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
}

ConnectionPool::~ConnectionPool() {
  shutdown();
  ::close(epoll_fd_);
  ::close(wake_fd_);
}

void ConnectionPool::shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  stopping_.store(true);
  Wake();
  poller_.join();
  {
    MutexLock lock(&mu_);
    ready_cv_.NotifyAll();
  }
  for (std::thread& t : workers_) t.join();
  MutexLock lock(&mu_);
  incoming_.clear();
}

void ConnectionPool::Adopt(int fd) {
  auto conn = std::make_unique<Connection>(fd);
  if (stopping_.load()) return;
  const TimePoint now = Clock::now();
  if (open_.load() >= limits_.max_connections) {
    // Over the cap: answered at once, on this (accept) thread, without a request read.
    const int64_t now_s =
        std::chrono::duration_cast<std::chrono::seconds>(now.time_since_epoch()).count();
    int64_t last = last_shed_log_.load();
    if (now_s - last >= 10 && last_shed_log_.compare_exchange_strong(last, now_s)) {
      PD_LOG_WARN("{} HTTP connections open (the cap): new connections get 503",
                  limits_.max_connections);
    }
    SendRefusal(*conn, ApiError::Overloaded("too many open connections"));
    // Lingering costs a socket each: past as many again, refused connections close at once.
    if (shedding_.load() >= limits_.max_connections) return;
    conn->CountIn(&shedding_);
    conn->state = Connection::State::kShedding;
    conn->deadline = now + kRefusalLinger;
  } else {
    conn->CountIn(&open_);
    conn->state = Connection::State::kHead;
    conn->deadline = now + limits_.header_timeout;
  }
  MutexLock lock(&mu_);
  incoming_.push_back(std::move(conn));
  Wake();
}

void ConnectionPool::Wake() {
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
}

void ConnectionPool::PollLoop() {
  std::vector<epoll_event> events(256);
  while (!stopping_.load()) {
    const TimePoint next = ExpireConnections();
    const auto wait = std::chrono::ceil<std::chrono::milliseconds>(next - Clock::now()).count();
    const int n = epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()),
                             static_cast<int>(std::clamp<int64_t>(wait, 0, 1000)));
    for (int i = 0; i < n; ++i) {
      if (events[i].data.fd == wake_fd_) {
        uint64_t count;
        (void)!::read(wake_fd_, &count, sizeof(count));
      } else {
        OnReadable(events[i].data.fd);
      }
    }
    std::vector<std::unique_ptr<Connection>> arrived;
    {
      MutexLock lock(&mu_);
      arrived.swap(incoming_);
    }
    for (auto& conn : arrived) Register(std::move(conn));
  }
  waiting_.clear();  // idle and half-arrived connections close with the server
}

void ConnectionPool::Register(std::unique_ptr<Connection> conn) {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.fd = conn->fd();
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, conn->fd(), &ev) != 0) {
    PD_LOG_WARN("epoll_ctl: {}", std::strerror(errno));
    return;  // closes it
  }
  const int fd = conn->fd();
  waiting_[fd] = std::move(conn);
}

void ConnectionPool::OnReadable(int fd) {
  auto it = waiting_.find(fd);
  if (it == waiting_.end()) return;
  Connection& conn = *it->second;
  const ssize_t n = conn.ReadAvailable(kPollReadBytes);
  if (conn.state == Connection::State::kShedding) {
    conn.Consume(conn.pending().size());
    if (n < 0) waiting_.erase(it);
    return;
  }
  const ScanState head = conn.ExamineHead();
  if (std::optional<ApiError> refusal = HeadRefusal(conn, head, limits_.max_head_bytes)) {
    PD_LOG_DEBUG("request head from {}:{} refused: {}", conn.remote_ip(), conn.remote_port(),
                 refusal->message);
    return Refuse(conn, *refusal);
  }
  if (head == ScanState::kComplete) return Dispatch(fd);
  if (n < 0) {
    waiting_.erase(it);  // the client closed (or reset) before a whole head
    return;
  }
  if (conn.state == Connection::State::kIdle && !conn.pending().empty()) {
    // The next request began: its head must arrive within the header timeout.
    conn.state = Connection::State::kHead;
    conn.deadline = Clock::now() + limits_.header_timeout;
  }
}

void ConnectionPool::Dispatch(int fd) {
  auto it = waiting_.find(fd);
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  std::unique_ptr<Connection> conn = std::move(it->second);
  waiting_.erase(it);
  MutexLock lock(&mu_);
  ready_.push_back(std::move(conn));
  ready_cv_.NotifyOne();
}

void ConnectionPool::Refuse(Connection& conn, const ApiError& error) {
  SendRefusal(conn, error);
  StartLinger(conn);
}

void ConnectionPool::StartLinger(Connection& conn) {
  conn.Consume(conn.pending().size());
  conn.CountIn(&shedding_);  // no longer counts against the cap
  conn.state = Connection::State::kShedding;
  conn.deadline = Clock::now() + kRefusalLinger;
}

TimePoint ConnectionPool::ExpireConnections() {
  const TimePoint now = Clock::now();
  TimePoint next = now + std::chrono::seconds(1);
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    Connection& conn = *it->second;
    if (conn.deadline > now) {
      next = std::min(next, conn.deadline);
      ++it;
      continue;
    }
    if (conn.state == Connection::State::kHead && !conn.pending().empty()) {
      // A head begun and not finished in time: 408, as nginx's client_header_timeout.
      PD_LOG_DEBUG("request head from {}:{} not complete in time: 408", conn.remote_ip(),
                   conn.remote_port());
      Refuse(conn, ApiError::RequestTimeout());
      next = std::min(next, conn.deadline);
      ++it;
      continue;
    }
    it = waiting_.erase(it);  // idle past the timeout, silent, or done lingering
  }
  return next;
}

void ConnectionPool::WorkerLoop() {
  for (;;) {
    std::unique_ptr<Connection> conn;
    {
      MutexLock lock(&mu_);
      // Work and shutdown both notify; the bound is a backstop only. (At one second, the
      // router's 256 idle workers woke together every second and stalled what was being
      // served on a small machine.)
      while (ready_.empty() && !stopping_.load()) {
        ready_cv_.WaitFor(&mu_, std::chrono::seconds(60));
      }
      // Heads already whole when the server stopped are still answered (as httplib's pool
      // runs the tasks queued before its shutdown).
      if (ready_.empty()) return;
      conn = std::move(ready_.front());
      ready_.pop_front();
    }
    switch (serve_(*conn)) {
      case AfterServe::kKeepOpen:
        GiveBack(std::move(conn), /*linger=*/false);
        break;
      case AfterServe::kLinger:
        GiveBack(std::move(conn), /*linger=*/true);
        break;
      case AfterServe::kClose:
        break;
    }
  }
}

void ConnectionPool::GiveBack(std::unique_ptr<Connection> conn, bool linger) {
  if (stopping_.load()) return;  // closes it
  if (linger) {
    StartLinger(*conn);
  } else if (conn->pending().empty()) {
    conn->state = Connection::State::kIdle;
    conn->deadline = Clock::now() + limits_.keep_alive_timeout;
  } else {
    conn->state = Connection::State::kHead;
    conn->deadline = Clock::now() + limits_.header_timeout;
  }
  MutexLock lock(&mu_);
  incoming_.push_back(std::move(conn));
  Wake();
}

}  // namespace pdserve::http
