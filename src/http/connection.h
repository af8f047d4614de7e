// One accepted HTTP connection and the httplib::Stream that reads it. Connection keeps the
// bytes read from the socket but not yet consumed by a request, across requests: httplib 0.11
// reads through a 4 KiB buffer that dies with each request, so the rest of a pipelined write
// (several requests in one TCP segment) was lost and the connection then idled until the
// keep-alive timeout. A Connection is owned by one thread at a time (the poller of
// http/connection_pool.h or the worker serving it); ConnectionStream lives on that worker.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <httplib.h>

#include "common/clock.h"

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
  // Whether pending() holds a whole request head (up to its blank line).
  bool HasCompleteHead();

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
  size_t begin_ = 0;      // buffer_[begin_..] is pending
  size_t head_scan_ = 0;  // offset in pending() from which no blank line can start earlier
  std::string remote_ip_, local_ip_;
  int remote_port_ = -1, local_port_ = -1;
};

// The Stream httplib parses a request from and writes its answer to: reads come from the
// connection's pending bytes first, then the socket (waiting up to the read timeout); writes
// wait up to the write timeout and fail once the client has gone (as httplib's SocketStream,
// so that a stream whose client left is cancelled).
class ConnectionStream final : public httplib::Stream {
 public:
  ConnectionStream(Connection& conn, Duration read_timeout, Duration write_timeout)
      : conn_(conn), read_timeout_(read_timeout), write_timeout_(write_timeout) {}

  bool is_readable() const override;
  bool is_writable() const override;
  ssize_t read(char* ptr, size_t size) override;
  using httplib::Stream::write;
  ssize_t write(const char* ptr, size_t size) override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  int socket() const override { return conn_.fd(); }

  // Bytes this stream handed to httplib (the request's head and body).
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  Connection& conn_;
  Duration read_timeout_, write_timeout_;
  uint64_t bytes_read_ = 0;
};

}  // namespace pdserve::http
