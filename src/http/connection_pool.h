// ConnectionPool: how an http::Server (http/server.h) holds its connections. httplib 0.11 gives
// every accepted connection a pool thread for its whole life, idle or not, so ~200 clients
// sending their headers a byte at a time (slowloris) held every thread and /health starved; it
// has no header deadline and no connection cap. Here one poller thread (epoll) holds every
// connection while it is idle between requests or its request head is still arriving, under
// a deadline (header_timeout for a head, the keep-alive timeout when idle); a worker thread
// takes a connection only once a whole, well-formed head is buffered, and gives it back when
// its pending bytes hold no further whole head. A malformed head (http/request_framing.h) is
// answered 400 as soon as its first bad byte arrives, and closed; connections over
// max_connections are answered 503 at once and closed. A slow client thus costs a socket and a
// few bytes, never a thread.
//
// Used as httplib's TaskQueue: httplib's accept loop enqueues each accepted socket's task,
// which runs at once on that thread and ends in Adopt(). shutdown() (httplib calls it when
// the server stops) closes idle and arriving connections and waits for the workers to finish
// the requests they serve. Adopt is called from the accept thread only; the rest is internal.
#pragma once

#include <atomic>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include <httplib.h>

#include "common/clock.h"
#include "common/mutex.h"
#include "http/api_error.h"
#include "http/connection.h"

namespace pdserve::http {

struct ConnectionLimits {
  int threads = 64;               // workers: requests served at once
  size_t max_connections = 4096;  // open connections; more are answered 503 and closed
  Duration header_timeout = std::chrono::seconds(10);  // a request head arrives within this
  Duration keep_alive_timeout = std::chrono::seconds(5);
  size_t max_head_bytes = 64 * 1024;  // a longer head is answered 431 (httplib caps lines)
};

// What serving leaves a connection to: kept open (back to the poller), closed, or refused (it
// was sent a refusal with SendRefusal and is read and discarded for a while before it closes,
// so that a client still sending reads the answer rather than a reset).
enum class AfterServe { kKeepOpen, kClose, kLinger };

class ConnectionPool final : public httplib::TaskQueue {
 public:
  // Serves the requests whose heads `conn` holds (the first whole and well-formed). Runs on a
  // worker.
  using ServeFn = std::function<AfterServe(Connection& conn)>;

  ConnectionPool(const ConnectionLimits& limits, ServeFn serve);
  ~ConnectionPool() override;  // shutdown()

  // httplib's accept loop: runs the task at once (it calls Adopt).
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override;

  // Takes the accepted socket `fd`.
  void Adopt(int fd);

 private:
  void PollLoop();
  void WorkerLoop();
  // Poller thread only, from here on.
  void Register(std::unique_ptr<Connection> conn);
  void OnReadable(int fd);
  void Dispatch(int fd);
  // Answers `error` (400, 408, 431) and drains the connection before closing it.
  void Refuse(Connection& conn, const ApiError& error);
  // Closes expired connections; returns the earliest deadline left.
  TimePoint ExpireConnections();
  // From a worker: back to the poller, idle or with a partial head, or (`linger`) refused.
  void GiveBack(std::unique_ptr<Connection> conn, bool linger);
  // The connection was answered a refusal: from now on its bytes are discarded until it
  // closes or kRefusalLinger passes; it no longer counts against max_connections.
  void StartLinger(Connection& conn);
  void Wake();

  const ConnectionLimits limits_;
  const ServeFn serve_;
  std::atomic<size_t> open_{0};      // counted against max_connections
  std::atomic<size_t> shedding_{0};  // refused, lingering before they close
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> last_shed_log_{0};
  int epoll_fd_ = -1;
  int wake_fd_ = -1;

  Mutex mu_;
  std::vector<std::unique_ptr<Connection>> incoming_ GUARDED_BY(mu_);
  std::deque<std::unique_ptr<Connection>> ready_ GUARDED_BY(mu_);  // whole heads, for workers
  CondVar ready_cv_;
  // Poller thread only.
  std::unordered_map<int, std::unique_ptr<Connection>> waiting_;

  std::thread poller_;
  std::vector<std::thread> workers_;
  bool shut_down_ = false;  // shutdown() ran (called once, from the accept thread)
};

// The whole answer (status line, headers with a fresh X-Request-Id, OpenAI-shaped JSON body)
// with which a connection is refused outside httplib: 503 (over the cap), 408 (head or body
// deadline), 431 (head too long), 400 (malformed head or chunked body), 413 (chunked body over
// the limit). It says "Connection: close".
std::string RefusalResponse(const ApiError& error);

// The refusal a connection's next head gets, given conn.ExamineHead() gave `state`: 400 if it
// is malformed, 431 if it is (or, unfinished, can only become) longer than `max_head_bytes`;
// nullopt if it may be served (kComplete) or waited for (kIncomplete).
std::optional<ApiError> HeadRefusal(const Connection& conn, ScanState state, size_t max_head_bytes);

// Sends RefusalResponse(error) without waiting (it is small: the socket's buffer takes it
// whole) and ends our side of the connection; the caller then lets it linger (AfterServe).
void SendRefusal(const Connection& conn, const ApiError& error);

}  // namespace pdserve::http
