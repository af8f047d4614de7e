#include "http/server.h"

#include <malloc.h>

#include <chrono>

namespace pdserve::http {
namespace {

// After a request this large, freed memory goes back to the system: a few multi-megabyte
// bodies (and what parsing them allocated) otherwise stay in the heap of whichever worker
// served them, and RSS grows by that much per worker.
constexpr uint64_t kTrimAfterBytes = uint64_t{1} << 20;

Duration TimeoutOf(time_t sec, time_t usec) {
  return std::chrono::duration_cast<Duration>(std::chrono::seconds(sec) +
                                              std::chrono::microseconds(usec));
}

}  // namespace

Server::Server() {
  new_task_queue = [this]() -> httplib::TaskQueue* {
    ConnectionLimits limits = limits_;
    limits.keep_alive_timeout = std::chrono::seconds(keep_alive_timeout_sec_);
    pool_ = new ConnectionPool(limits, [this](Connection& conn) { return Serve(conn); });
    return pool_;
  };
}

bool Server::process_and_close_socket(socket_t sock) {
  pool_->Adopt(sock);
  return true;
}

bool Server::Serve(Connection& conn) {
  const Duration read_timeout = TimeoutOf(read_timeout_sec_, read_timeout_usec_);
  const Duration write_timeout = TimeoutOf(write_timeout_sec_, write_timeout_usec_);
  for (;;) {
    ConnectionStream stream(conn, read_timeout, write_timeout);
    ++conn.requests_served;
    // The last request of the connection, or the server is stopping: "Connection: close".
    const bool last = conn.requests_served >= keep_alive_max_count_ || svr_sock_ == INVALID_SOCKET;
    bool client_closes = false;
    const bool ok = process_request(stream, last, client_closes, nullptr);
    if (stream.bytes_read() >= kTrimAfterBytes) malloc_trim(0);
    if (!ok || client_closes || last) return false;
    // A pipelined request whose head is already here is served at once, on this thread.
    if (!conn.HasCompleteHead()) return true;
  }
}

}  // namespace pdserve::http
