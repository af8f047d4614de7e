// One accepted HTTP connection and the httplib::Stream that reads it. Connection keeps the
// bytes read from the socket but not yet consumed by a request, across requests: httplib 0.11
// reads through a 4 KiB buffer that dies with each request, so the rest of a pipelined write
// (several requests in one TCP segment) was lost and the connection then idled until the
// keep-alive timeout. It also finds where the next request's head ends and whether it is
// well-formed (http/request_framing.h), and ConnectionStream holds httplib to one request's
// bytes, so that what httplib leaves unread of a request is never parsed as the next one.
// A Connection is owned by one thread at a time (the poller of http/connection_pool.h or the
// worker serving it); ConnectionStream lives on that worker.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <httplib.h>

#include "common/clock.h"
#include "http/request_framing.h"

namespace pdserve::http {

class Connection {
 public:
  // Takes ownership of the connected socket `fd`.
  explicit Connection(int fd);
  ~Connection();  // shuts the socket down and closes it
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  int fd() const { return fd_; }
  // Counts this connection in `counter` (nullptr: in none) until it closes or is counted
  // elsewhere.
  void CountIn(std::atomic<size_t>* counter);
  // Read from the socket, not yet consumed by a request.
  std::string_view pending() const { return std::string_view(buffer_).substr(begin_); }
  void Consume(size_t n);
  // Appends what the socket holds now, at most `max_bytes`, never blocking. Returns the bytes
  // appended; 0 when none are there; -1 at the end of the stream or on an error.
  ssize_t ReadAvailable(size_t max_bytes);
  // ReadAvailable, waiting up to `timeout` for the first byte: 0 when none came in time.
  ssize_t ReadWithin(Duration timeout);
  // Whether pending() holds the whole head of the next request, and whether it is well-formed
  // (checked as it arrives, so garbage is found in its first bytes). Empty lines before a
  // request line are dropped (RFC 9112 2.2). Rescans nothing already scanned.
  ScanState ExamineHead();
  // After ExamineHead() gave kComplete: where the request ends. After kMalformed: why.
  const RequestFraming& framing() const { return framing_; }
  const std::string& head_problem() const { return head_problem_; }

  const std::string& remote_ip() const { return remote_ip_; }
  int remote_port() const { return remote_port_; }
  const std::string& local_ip() const { return local_ip_; }
  int local_port() const { return local_port_; }

  // Bookkeeping of the owner (see http/connection_pool.h).
  enum class State { kIdle, kHead, kShedding };
  State state = State::kHead;
  TimePoint deadline{};
  size_t requests_served = 0;

 private:
  int fd_;
  std::atomic<size_t>* counter_ = nullptr;
  std::string buffer_;
  size_t begin_ = 0;  // buffer_[begin_..] is pending
  // The head at the start of pending(), as far as scanned; reset by Consume.
  HeadScanner head_scanner_;
  ScanState head_state_ = ScanState::kIncomplete;
  RequestFraming framing_;
  std::string head_problem_;
  std::string remote_ip_, local_ip_;
  int remote_port_ = -1, local_port_ = -1;
};

// The Stream httplib parses one request from and writes its answer to: reads come from the
// connection's pending bytes first, then the socket (waiting up to the read timeout), and end
// (read 0) at the request's last byte, so httplib never reads into the next request (a body
// it does not expect, for instance); writes wait up to the write timeout and fail once the
// client has gone (as httplib's SocketStream, so that a stream whose client left is
// cancelled).
class ConnectionStream final : public httplib::Stream {
 public:
  // `request_bytes`: the request's head and body, as sent.
  ConnectionStream(Connection& conn, uint64_t request_bytes, Duration read_timeout,
                   Duration write_timeout)
      : conn_(conn),
        request_bytes_(request_bytes),
        read_timeout_(read_timeout),
        write_timeout_(write_timeout) {}

  bool is_readable() const override;
  bool is_writable() const override;
  ssize_t read(char* ptr, size_t size) override;
  using httplib::Stream::write;
  ssize_t write(const char* ptr, size_t size) override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  int socket() const override { return conn_.fd(); }

  // Bytes of the request this stream did not hand to httplib.
  uint64_t unread() const { return request_bytes_ - bytes_read_; }

 private:
  Connection& conn_;
  const uint64_t request_bytes_;
  Duration read_timeout_, write_timeout_;
  uint64_t bytes_read_ = 0;
};

}  // namespace pdserve::http
