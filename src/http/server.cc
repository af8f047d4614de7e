#include "http/server.h"

#include <malloc.h>

#include <chrono>
#include <exception>
#include <optional>
#include <string>
#include <utility>

#include "common/logging.h"

namespace pdserve::http {
namespace {

// After a request this large, freed memory goes back to the system: a few multi-megabyte
// bodies (and what parsing them allocated) otherwise stay in the heap of whichever worker
// served them, and RSS grows by that much per worker.
constexpr uint64_t kTrimAfterBytes = uint64_t{1} << 20;

thread_local int current_client_socket = -1;

// Sets current_client_socket for the scope of one request's answer.
class ClientSocketScope {
 public:
  explicit ClientSocketScope(int fd) { current_client_socket = fd; }
  ~ClientSocketScope() { current_client_socket = -1; }
  ClientSocketScope(const ClientSocketScope&) = delete;
  ClientSocketScope& operator=(const ClientSocketScope&) = delete;
};

constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";

Duration TimeoutOf(time_t sec, time_t usec) {
  return std::chrono::duration_cast<Duration>(std::chrono::seconds(sec) +
                                              std::chrono::microseconds(usec));
}

// A request read whole into its connection's buffer, or why it was not.
struct WholeRequest {
  uint64_t bytes = 0;               // head and body as sent
  std::string body;                 // decoded
  std::optional<ApiError> refusal;  // answer this and close (a chunked body too large, ...)
  bool gone = false;                // the client left before its body was whole
};

// Reads the body of the request whose head starts conn.pending() until it is all buffered.
// A body declared over `max_body` is left unread (the pre-routing handler answers 413 and
// closes the connection). A client waiting for "100 Continue" gets it first.
WholeRequest ReadWholeRequest(Connection& conn, const RequestFraming& framing, uint64_t max_body,
                              Duration read_timeout, Duration write_timeout) {
  WholeRequest whole;
  whole.bytes = framing.head_size;
  if (framing.body == RequestFraming::Body::kNone) return whole;
  if (framing.body == RequestFraming::Body::kLength && framing.length > max_body) {
    whole.bytes += framing.length;
    return whole;
  }
  bool asked_to_continue = false;
  // Reads more once what is there is used up; false (and `whole` says why) if none came.
  auto read_more = [&](std::string_view what) {
    if (framing.expect_continue && !asked_to_continue) {
      asked_to_continue = true;
      ConnectionStream stream(conn, 0, read_timeout, write_timeout);
      (void)stream.write(kContinue.data(), kContinue.size());
    }
    const ssize_t n = conn.ReadWithin(read_timeout);
    if (n < 0) {
      whole.gone = true;
    } else if (n == 0) {
      whole.refusal = ApiError::RequestTimeout(std::string(what) + " did not arrive in time");
    }
    return n > 0;
  };
  if (framing.body == RequestFraming::Body::kLength) {
    const uint64_t end = framing.head_size + framing.length;
    while (conn.pending().size() < end) {
      if (!read_more("the request body")) return whole;
    }
    whole.bytes = end;
    whole.body.assign(conn.pending().substr(framing.head_size, framing.length));
    return whole;
  }
  ChunkedBodyScanner chunks(max_body);
  for (;;) {
    const size_t scanned = framing.head_size + static_cast<size_t>(chunks.encoded_size());
    switch (chunks.Scan(conn.pending().substr(scanned), &whole.body)) {
      case ChunkedBodyScanner::State::kComplete:
        whole.bytes += chunks.encoded_size();
        return whole;
      case ChunkedBodyScanner::State::kTooLarge:
        whole.refusal = ApiError::PayloadTooLarge();
        return whole;
      case ChunkedBodyScanner::State::kMalformed:
        whole.refusal = ApiError::MalformedRequest(chunks.problem());
        return whole;
      case ChunkedBodyScanner::State::kIncomplete:
        if (!read_more("the chunked request body")) return whole;
        break;
    }
  }
}

}  // namespace

int CurrentClientSocket() { return current_client_socket; }

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

AfterServe Server::Serve(Connection& conn) {
  const Duration read_timeout = TimeoutOf(read_timeout_sec_, read_timeout_usec_);
  const Duration write_timeout = TimeoutOf(write_timeout_sec_, write_timeout_usec_);
  for (;;) {
    // conn.ExamineHead() was kComplete (the pool's precondition, and this loop's).
    WholeRequest whole =
        ReadWholeRequest(conn, conn.framing(), payload_max_length_, read_timeout, write_timeout);
    if (whole.refusal) {
      SendRefusal(conn, *whole.refusal);
      return AfterServe::kLinger;
    }
    if (whole.gone) return AfterServe::kClose;
    ConnectionStream stream(conn, whole.bytes, read_timeout, write_timeout);
    ++conn.requests_served;
    // The last request of the connection, or the server is stopping: "Connection: close".
    const bool last = conn.requests_served >= keep_alive_max_count_ || svr_sock_ == INVALID_SOCKET;
    bool client_closes = false;
    bool ok = false;
    const ClientSocketScope socket_scope(conn.fd());
    try {
      ok = process_request(stream, last, client_closes, [&whole](httplib::Request& req) {
        req.body = std::move(whole.body);
        // Met already: "100 Continue" went out before the body was read, if it had to.
        req.headers.erase("Expect");
      });
    } catch (const std::exception& e) {
      // Routes' exceptions are httplib's exception handler's; this is one from writing the
      // answer (a stream's provider). Whatever was sent, the connection cannot go on.
      PD_LOG_ERROR("HTTP exception while answering {}:{}: {}", conn.remote_ip(), conn.remote_port(),
                   e.what());
      return AfterServe::kClose;
    } catch (...) {
      PD_LOG_ERROR("HTTP exception while answering {}:{}", conn.remote_ip(), conn.remote_port());
      return AfterServe::kClose;
    }
    if (whole.bytes >= kTrimAfterBytes) malloc_trim(0);
    // What no route read (a refused request's body, a GET's) is no request: drop it, or close
    // if it was never buffered (a body over the limit).
    if (stream.unread() > conn.pending().size()) return AfterServe::kClose;
    conn.Consume(static_cast<size_t>(stream.unread()));
    if (!ok || client_closes || last) return AfterServe::kClose;
    // A pipelined request whose head is already here is served at once, on this thread.
    const ScanState head = conn.ExamineHead();
    if (std::optional<ApiError> refusal = HeadRefusal(conn, head, limits_.max_head_bytes)) {
      SendRefusal(conn, *refusal);
      return AfterServe::kLinger;
    }
    if (head == ScanState::kIncomplete) return AfterServe::kKeepOpen;
  }
}

}  // namespace pdserve::http
