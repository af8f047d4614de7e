#include "router/router_upstream.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string_view>
#include <utility>

namespace pdserve::router {
namespace {

// How often a long read looks at its abort flag.
constexpr auto kAbortCheckInterval = std::chrono::milliseconds(200);
// A node's response head is a status line and a few headers.
constexpr size_t kMaxHeadBytes = 64 * 1024;
constexpr size_t kReadBytes = 16 * 1024;

int PollMs(Deadline deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline.Remaining()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 60'000));
}

// Waits for `events` on `fd` until `deadline`; true when they came.
bool WaitFor(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, PollMs(deadline));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return false;
    if (deadline.Passed()) return false;
  }
}

// Connects the non-blocking socket `fd` to `addr` within `deadline`; false with *error set.
bool ConnectWithin(int fd, const addrinfo& addr, Deadline deadline, std::string* error) {
  if (connect(fd, addr.ai_addr, addr.ai_addrlen) != 0 && errno != EINPROGRESS) {
    *error = std::strerror(errno);
    return false;
  }
  if (!WaitFor(fd, POLLOUT, deadline)) {
    *error = "connection timed out";
    return false;
  }
  int so_error = 0;
  socklen_t len = sizeof(so_error);
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len) != 0) so_error = errno;
  if (so_error != 0) *error = std::strerror(so_error);
  return so_error == 0;
}

// A non-blocking TCP socket connected to the node within `deadline` (TCP_NODELAY: a relayed
// request and the node's small events leave at once), or -1 with *error set.
int Connect(const NodeAddress& node, Deadline deadline, std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(node.port);
  if (const int rc = getaddrinfo(node.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    *error = std::string("cannot resolve ") + node.host + ": " + gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      *error = std::strerror(errno);
      continue;
    }
    const int on = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
    if (!ConnectWithin(fd, *a, deadline, error)) {
      ::close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  return fd;
}

// Whether the header value has characters that would end a header line early.
bool BreaksLine(std::string_view value) {
  return value.find_first_of("\r\n") != std::string_view::npos;
}

std::string_view TrimWhitespace(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Whether the comma-separated header value `list` holds `token` (case-insensitive).
bool HasToken(std::string_view list, std::string_view token) {
  while (!list.empty()) {
    const size_t comma = list.find(',');
    const std::string_view item = TrimWhitespace(list.substr(0, comma));
    if (item.size() == token.size() && strncasecmp(item.data(), token.data(), token.size()) == 0) {
      return true;
    }
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return false;
}

// The "timeout=N" of a Keep-Alive header ("timeout=5, max=5"), or zero if it has none.
Duration KeepAliveTimeout(std::string_view value) {
  while (!value.empty()) {
    const size_t comma = value.find(',');
    const std::string_view item = TrimWhitespace(value.substr(0, comma));
    if (item.size() > 8 && strncasecmp(item.data(), "timeout=", 8) == 0) {
      const long seconds = std::strtol(std::string(item.substr(8)).c_str(), nullptr, 10);
      if (seconds > 0) return std::chrono::seconds(seconds);
    }
    if (comma == std::string_view::npos) break;
    value.remove_prefix(comma + 1);
  }
  return Duration::zero();
}

}  // namespace

std::shared_ptr<UpstreamExchange> UpstreamExchange::Start(NodeAddress node,
                                                          const UpstreamRequest& request,
                                                          UpstreamTimeouts timeouts,
                                                          UpstreamConnections* connections) {
  std::shared_ptr<UpstreamExchange> exchange(
      new UpstreamExchange(std::move(node), timeouts, connections));
  (void)exchange->Send(request);
  return exchange;
}

UpstreamExchange::~UpstreamExchange() {
  if (fd_ >= 0) ::close(fd_);
}

void UpstreamExchange::Fail(std::string error) {
  if (error_.empty()) error_ = std::move(error);
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

bool UpstreamExchange::Send(const UpstreamRequest& request) {
  // One write for head and body. No "Connection: close": the connection is kept for the next
  // request once this one's answer ended.
  std::string& out = request_;
  out = request.method + " " + request.path + " HTTP/1.1\r\nHost: " + node_.host + ":" +
        std::to_string(node_.port) + "\r\n";
  for (const auto& [name, value] : request.headers) {
    if (!BreaksLine(name) && !BreaksLine(value))
      out.append(name).append(": ").append(value) += "\r\n";
  }
  if (request.method != "GET" || !request.body.empty()) {
    out += "Content-Length: " + std::to_string(request.body.size()) + "\r\n";
  }
  out += "\r\n";
  out += request.body;
  return Transmit(/*reuse_idle=*/true);
}

bool UpstreamExchange::Transmit(bool reuse_idle) {
  std::string error;
  if (connections_ != nullptr && reuse_idle) {
    // An idle connection may still fail to take the request (the node closed it a moment
    // ago): the request then goes to the next one, and at last to a new connection.
    for (fd_ = connections_->Take(node_.url); fd_ >= 0; fd_ = connections_->Take(node_.url)) {
      reused_ = true;
      if (WriteRequest(&error)) return true;
      ::close(fd_);
    }
  }
  reused_ = false;
  fd_ = Connect(node_, Deadline::After(timeouts_.connect), &error);
  if (fd_ < 0) {
    connect_failed_ = true;
    Fail(node_.url + " unreachable: " + error);
    return false;
  }
  if (connections_ != nullptr) connections_->CountOpened();
  if (!WriteRequest(&error)) {
    Fail("sending the request failed: " + error);
    return false;
  }
  return true;
}

bool UpstreamExchange::WriteRequest(std::string* error) {
  const Deadline deadline = Deadline::After(timeouts_.write);
  for (size_t sent = 0; sent < request_.size();) {
    const ssize_t n = send(fd_, request_.data() + sent, request_.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) &&
               WaitFor(fd_, POLLOUT, deadline)) {
      continue;
    } else {
      *error = n < 0 ? std::strerror(errno) : "connection closed";
      return false;
    }
  }
  return true;
}

void UpstreamExchange::FinishConnection() {
  if (fd_ < 0) return;
  if (connections_ != nullptr && keep_alive_ && in_.empty()) {
    connections_->Put(node_.url, fd_, node_keep_alive_);
  } else {
    ::close(fd_);
  }
  fd_ = -1;
}

ssize_t UpstreamExchange::Fill(Deadline deadline, bool wait) {
  // Into a buffer of its own: growing in_ by the most a read may bring would zero that much
  // memory per event.
  char buf[kReadBytes];
  for (;;) {
    // What the node sent meanwhile is taken without waiting; a wait comes only when nothing
    // is there.
    const ssize_t got = recv(fd_, buf, sizeof(buf), MSG_DONTWAIT);
    if (got > 0) {
      in_.append(buf, static_cast<size_t>(got));
      answered_ = true;
      return got;
    }
    if (got == 0) return -1;  // the node closed the connection
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -1;
    if (!wait) return 0;
    pollfd p{fd_, POLLIN, 0};
    const int n = poll(&p, 1, PollMs(deadline));
    if (n < 0 && errno != EINTR) return -1;
    if (n == 0 && deadline.Passed()) return 0;
  }
}

bool UpstreamExchange::ParseHead(size_t head_size) {
  const std::string_view head(in_.data(), head_size);
  size_t line_end = head.find("\r\n");
  const std::string_view status_line = head.substr(0, line_end);
  int status = 0;
  if (status_line.starts_with("HTTP/1.") && status_line.size() >= 12 && status_line[8] == ' ') {
    status = std::atoi(std::string(status_line.substr(9, 3)).c_str());
  }
  if (status < 100 || status > 999) {
    Fail("malformed response status line");
    return false;
  }
  UpstreamHead parsed;
  parsed.status = status;
  for (size_t start = line_end + 2; start < head.size(); start = line_end + 2) {
    line_end = head.find("\r\n", start);
    const std::string_view line = head.substr(start, line_end - start);
    if (line.empty()) break;
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0) {
      Fail("malformed response header line");
      return false;
    }
    parsed.headers.emplace(std::string(line.substr(0, colon)),
                           std::string(TrimWhitespace(line.substr(colon + 1))));
  }
  const bool http11 = status_line.starts_with("HTTP/1.1");
  in_.erase(0, head_size);        // `head` and `status_line` end here
  if (status < 200) return true;  // an interim answer: the real head follows
  auto header = [&](const char* name) {
    auto it = parsed.headers.find(name);
    return it == parsed.headers.end() ? std::string() : it->second;
  };
  // HTTP/1.1 keeps the connection unless the node says otherwise (it does on its last request
  // per connection, and when it stops).
  keep_alive_ = http11 && !HasToken(header("Connection"), "close");
  node_keep_alive_ = KeepAliveTimeout(header("Keep-Alive"));
  if (status == 204 || status == 304) {
    body_ = Body::kNone;
    done_ = true;
  } else if (strcasecmp(header("Transfer-Encoding").c_str(), "chunked") == 0) {
    body_ = Body::kChunked;
    // What the node streams is bounded by the read deadline, not by size.
    chunks_.emplace(std::numeric_limits<uint64_t>::max());
  } else if (const std::string length = header("Content-Length"); !length.empty()) {
    body_ = Body::kLength;
    body_left_ = std::strtoull(length.c_str(), nullptr, 10);
    done_ = body_left_ == 0;
  } else {
    body_ = Body::kUntilClose;
    keep_alive_ = false;
  }
  head_ = std::move(parsed);
  return true;
}

Result<UpstreamHead> UpstreamExchange::WaitHead(Deadline deadline) {
  while (!head_.has_value()) {
    if (!error_.empty()) return Status::Unavailable(node_.url + ": " + error_);
    if (const size_t end = in_.find("\r\n\r\n"); end != std::string::npos) {
      (void)ParseHead(end + 4);
      continue;
    }
    if (in_.size() > kMaxHeadBytes) {
      Fail("response head too large");
      continue;
    }
    const ssize_t n = Fill(deadline);
    if (n == 0)
      return Status::DeadlineExceeded(node_.url + ": no response head before the deadline");
    if (n < 0 && reused_ && !answered_) {
      // An idle connection the node had closed (its keep-alive timeout, a restart) before
      // the request reached it: nothing ran there, so the request goes out again, on a new
      // connection.
      ::close(fd_);
      fd_ = -1;
      (void)Transmit(/*reuse_idle=*/false);
      continue;
    }
    if (n < 0) Fail("connection closed before a response");
  }
  request_.clear();
  request_.shrink_to_fit();
  return *head_;
}

bool UpstreamExchange::TakeBody(std::string* data) {
  switch (body_) {
    case Body::kNone:
      return true;
    case Body::kLength: {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(body_left_, in_.size()));
      data->append(in_, 0, n);
      in_.erase(0, n);
      body_left_ -= n;
      return body_left_ == 0;
    }
    case Body::kChunked: {
      const uint64_t before = chunks_->encoded_size();
      const http::ChunkedBodyScanner::State state = chunks_->Scan(in_, data);
      in_.erase(0, static_cast<size_t>(chunks_->encoded_size() - before));
      if (state == http::ChunkedBodyScanner::State::kMalformed ||
          state == http::ChunkedBodyScanner::State::kTooLarge) {
        Fail(std::string("malformed response body: ") + chunks_->problem());
      }
      return state == http::ChunkedBodyScanner::State::kComplete;
    }
    case Body::kUntilClose:
      data->append(in_);
      in_.clear();
      return false;
  }
  return false;
}

UpstreamExchange::Next UpstreamExchange::Pop(std::string* data, Deadline deadline) {
  return PopWithin(data, deadline, /*wait=*/true);
}

UpstreamExchange::Next UpstreamExchange::PopReady(std::string* data) {
  return PopWithin(data, Deadline::After(Duration::zero()), /*wait=*/false);
}

UpstreamExchange::Next UpstreamExchange::PopWithin(std::string* data, Deadline deadline,
                                                   bool wait) {
  data->clear();
  bool filled = false;  // without `wait`, the one read is done
  for (;;) {
    if (!error_.empty()) {
      *data = error_;
      return Next::kError;
    }
    if (!done_ && !in_.empty()) done_ = TakeBody(data);
    if (!error_.empty()) continue;
    if (!data->empty()) return Next::kData;
    if (done_) {
      // The whole answer is here: the connection may carry the next request.
      FinishConnection();
      return Next::kEnd;
    }
    if (filled) return Next::kTimeout;
    filled = !wait;
    const ssize_t n = Fill(deadline, wait);
    if (n == 0) return Next::kTimeout;
    if (n < 0) {
      if (body_ == Body::kUntilClose) {
        done_ = true;
      } else {
        Fail("connection closed before the end of the response");
      }
    }
  }
}

Result<std::string> UpstreamExchange::ReadAll(Deadline deadline, size_t limit,
                                              const std::atomic<bool>* abort) {
  std::string body;
  std::string piece;
  for (;;) {
    const Deadline slice(std::min(deadline.at(), Clock::now() + kAbortCheckInterval));
    switch (Pop(&piece, slice)) {
      case Next::kData:
        body += piece;
        if (body.size() > limit) {
          Cancel();
          return Status::ResourceExhausted(node_.url + ": response body exceeds the limit");
        }
        break;
      case Next::kEnd:
        return body;
      case Next::kTimeout:
        if (abort != nullptr && abort->load()) {
          Cancel();
          return Status::Cancelled(node_.url + ": abandoned (router stopping)");
        }
        if (!deadline.Passed()) break;
        Cancel();
        return Status::DeadlineExceeded(node_.url + ": response body not complete in time");
      case Next::kError:
        return Status::Unavailable(node_.url + ": " + piece);
    }
  }
}

void UpstreamExchange::Cancel() {
  // What arrived before a cancel is not the whole answer: readers must not take it for one.
  if (!done_) Fail("cancelled");
}

}  // namespace pdserve::router
