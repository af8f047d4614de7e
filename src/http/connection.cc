#include "http/connection.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace pdserve::http {
namespace {

// Reads straight into the caller's buffer from this size on (large body reads); smaller reads
// fill the connection's buffer with up to this much, so that byte-by-byte head parsing costs
// one recv per chunk.
constexpr size_t kReadChunk = 16 * 1024;

void AddressOf(const sockaddr_storage& addr, std::string* ip, int* port) {
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    *port = ntohs(in->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
    *port = ntohs(in6->sin6_port);
  }
  *ip = text;
}

// Waits up to `timeout` for `events` on `fd`; true when they came.
bool WaitFor(int fd, short events, Duration timeout) {
  const Deadline end = Deadline::After(timeout);
  for (;;) {
    pollfd p{fd, events, 0};
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(end.Remaining()).count();
    const int n = poll(&p, 1, static_cast<int>(std::min<int64_t>(ms, 60'000)));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return false;
    if (end.Passed()) return false;
  }
}

}  // namespace

Connection::Connection(int fd) : fd_(fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getpeername(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    AddressOf(addr, &remote_ip_, &remote_port_);
  }
  addr = {};
  len = sizeof(addr);
  if (getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    AddressOf(addr, &local_ip_, &local_port_);
  }
}

Connection::~Connection() {
  ::shutdown(fd_, SHUT_RDWR);
  ::close(fd_);
  CountIn(nullptr);
}

void Connection::CountIn(std::atomic<size_t>* counter) {
  if (counter_ != nullptr) counter_->fetch_sub(1);
  counter_ = counter;
  if (counter_ != nullptr) counter_->fetch_add(1);
}

void Connection::Consume(size_t n) {
  begin_ += std::min(n, buffer_.size() - begin_);
  // The next head starts elsewhere now: scanned afresh.
  head_scanner_ = HeadScanner();
  head_state_ = ScanState::kIncomplete;
  if (begin_ == buffer_.size()) {
    buffer_.clear();
    begin_ = 0;
    // A large pipelined body may have grown the buffer: give the memory back once it is read.
    if (buffer_.capacity() > 4 * kReadChunk) buffer_.shrink_to_fit();
  } else if (begin_ >= kReadChunk && begin_ * 2 >= buffer_.size()) {
    buffer_.erase(0, begin_);
    begin_ = 0;
  }
}

ssize_t Connection::ReadAvailable(size_t max_bytes) {
  size_t total = 0;
  while (total < max_bytes) {
    const size_t want = std::min(kReadChunk, max_bytes - total);
    const size_t old_size = buffer_.size();
    buffer_.resize(old_size + want);
    const ssize_t n = recv(fd_, buffer_.data() + old_size, want, MSG_DONTWAIT);
    buffer_.resize(old_size + static_cast<size_t>(std::max<ssize_t>(n, 0)));
    if (n > 0) {
      total += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    return total > 0 ? static_cast<ssize_t>(total) : -1;  // end of stream (or reset)
  }
  return static_cast<ssize_t>(total);
}

ssize_t Connection::ReadWithin(Duration timeout) {
  if (!WaitFor(fd_, POLLIN, timeout)) return 0;
  return ReadAvailable(4 * kReadChunk);
}

ScanState Connection::ExamineHead() {
  if (head_state_ != ScanState::kIncomplete) return head_state_;
  if (!head_scanner_.started()) {
    while (pending().starts_with("\r\n")) Consume(2);
    if (pending() == "\r") return ScanState::kIncomplete;  // perhaps another empty line
  }
  head_state_ = head_scanner_.Scan(pending());
  if (head_state_ == ScanState::kMalformed) {
    head_problem_ = head_scanner_.problem();
  } else if (head_state_ == ScanState::kComplete) {
    Result<RequestFraming> framing = ParseFraming(pending().substr(0, head_scanner_.head_size()));
    if (framing.ok()) {
      framing_ = *framing;
    } else {
      head_state_ = ScanState::kMalformed;
      head_problem_ = framing.status().message();
    }
  }
  return head_state_;
}

bool ConnectionStream::is_readable() const {
  return !conn_.pending().empty() || WaitFor(conn_.fd(), POLLIN, read_timeout_);
}

bool ConnectionStream::is_writable() const {
  // One poll for both questions in the usual case (room to write, nothing to read): write()
  // asks before every send, and a stream sends once per event.
  pollfd p{conn_.fd(), POLLOUT | POLLIN, 0};
  if (poll(&p, 1, 0) < 0) return false;
  if ((p.revents & POLLIN) != 0) {
    // Like httplib's is_socket_alive: a readable socket whose peek finds the end of the stream
    // belongs to a client that went away.
    char byte;
    if (recv(conn_.fd(), &byte, 1, MSG_PEEK | MSG_DONTWAIT) <= 0) return false;
  }
  if ((p.revents & (POLLERR | POLLHUP)) != 0) return false;
  return (p.revents & POLLOUT) != 0 || WaitFor(conn_.fd(), POLLOUT, write_timeout_);
}

ssize_t ConnectionStream::read(char* ptr, size_t size) {
  size = static_cast<size_t>(std::min<uint64_t>(size, unread()));
  if (size == 0) return 0;  // the request's end: what follows is the next request's
  if (conn_.pending().empty()) {
    if (!is_readable()) return -1;
    if (size >= kReadChunk) {
      const ssize_t n = recv(conn_.fd(), ptr, size, 0);
      if (n > 0) bytes_read_ += static_cast<uint64_t>(n);
      return n;
    }
    if (conn_.ReadAvailable(kReadChunk) <= 0) return -1;
  }
  const std::string_view p = conn_.pending();
  const size_t n = std::min(size, p.size());
  std::memcpy(ptr, p.data(), n);
  conn_.Consume(n);
  bytes_read_ += n;
  return static_cast<ssize_t>(n);
}

ssize_t ConnectionStream::write(const char* ptr, size_t size) {
  // Before every write, as httplib's SocketStream: a client that left is noticed here, before
  // another token is made for it (a send to a closed peer still succeeds once).
  if (!is_writable()) return -1;
  for (;;) {
    const ssize_t n = send(conn_.fd(), ptr, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) return n;
    if (errno == EINTR) continue;
    if ((errno != EAGAIN && errno != EWOULDBLOCK) ||
        !WaitFor(conn_.fd(), POLLOUT, write_timeout_)) {
      return -1;
    }
  }
}

void ConnectionStream::get_remote_ip_and_port(std::string& ip, int& port) const {
  ip = conn_.remote_ip();
  port = conn_.remote_port();
}

void ConnectionStream::get_local_ip_and_port(std::string& ip, int& port) const {
  ip = conn_.local_ip();
  port = conn_.local_port();
}

}  // namespace pdserve::http
