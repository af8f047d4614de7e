// One HTTP/1.1 exchange between the router and a node: it sends the request on an idle
// keep-alive connection to the node (router/upstream_connections.h) or a new one, reads the
// response head, then the body piece by piece as the node sends it (chunked, sized or until the
// node closes) — waiting itself (Pop, ReadAll: the client's handler thread, for a whole answer)
// or reading only what is there when the caller waits on the socket (PopReady: the relay thread
// of router/relay_loop.h, for a stream). A response read whole gives its connection back for
// the next request; Cancel, or destruction before the end, closes it, which the node takes for
// its client leaving. Thread-compatible: used by one thread at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <httplib.h>

#include "common/clock.h"
#include "common/status.h"
#include "http/request_framing.h"
#include "router/router_nodes.h"
#include "router/upstream_connections.h"

namespace pdserve::router {

struct UpstreamRequest {
  std::string method;  // "GET" or "POST"
  std::string path;    // with its query, as the client sent it
  httplib::Headers headers;
  std::string body;
};

struct UpstreamTimeouts {
  Duration connect = std::chrono::seconds(2);
  Duration read = std::chrono::seconds(600);  // longest silence from the node
  Duration write = std::chrono::seconds(30);
};

struct UpstreamHead {
  int status = 0;
  httplib::Headers headers;
};

class UpstreamExchange {
 public:
  // Sends `request` to `node` on an idle connection from `connections` or, if there is none,
  // a new one (within the connect and write timeouts); a failure is reported by WaitHead.
  // `connections` (null: a new connection each time, closed after the response) outlives the
  // exchange.
  static std::shared_ptr<UpstreamExchange> Start(NodeAddress node, const UpstreamRequest& request,
                                                 UpstreamTimeouts timeouts,
                                                 UpstreamConnections* connections = nullptr);
  ~UpstreamExchange();  // closes the node connection unless it went back to `connections`
  UpstreamExchange(const UpstreamExchange&) = delete;
  UpstreamExchange& operator=(const UpstreamExchange&) = delete;

  // The response head. Unavailable if the node could not be reached or failed before sending
  // a head (the request never started there, so it may be retried elsewhere; a reused
  // connection the node closed while it was idle is first replaced by a new one);
  // DeadlineExceeded past `deadline` (call again to wait on).
  Result<UpstreamHead> WaitHead(Deadline deadline);

  enum class Next { kData, kEnd, kTimeout, kError };
  // After WaitHead: the next body piece into *data (kData), the end of the body (kEnd),
  // nothing before `deadline` (kTimeout), or a broken exchange (kError, message in *data).
  Next Pop(std::string* data, Deadline deadline);
  // Pop without waiting: what the node's socket holds now (at most one read), kTimeout if that
  // is no whole body piece. For a caller that waits for the socket itself (router/relay_loop.h).
  Next PopReady(std::string* data);
  // Whether PopReady has something without reading the socket: bytes read already, the body's
  // end or an error.
  bool holds_unread() const { return !in_.empty() || done_ || !error_.empty(); }
  // The node connection's socket while the body is being read (-1 once it ended or broke).
  int socket() const { return fd_; }

  // The whole remaining body, for non-streamed responses. Errors if the exchange breaks or
  // the body exceeds `limit`; Cancelled (and the exchange cancelled) once `*abort` is set
  // (checked a few times a second; null: never).
  Result<std::string> ReadAll(Deadline deadline, size_t limit,
                              const std::atomic<bool>* abort = nullptr);

  // Closes the node connection, unless the response ended whole already; the exchange then
  // reports "cancelled" as its error.
  void Cancel();
  bool connect_failed() const { return connect_failed_; }
  const NodeAddress& node() const { return node_; }

 private:
  enum class Body { kNone, kLength, kChunked, kUntilClose };

  UpstreamExchange(NodeAddress node, UpstreamTimeouts timeouts, UpstreamConnections* connections)
      : node_(std::move(node)), timeouts_(timeouts), connections_(connections) {}
  // Writes the request and sends it; false (and error_ set) on failure.
  bool Send(const UpstreamRequest& request);
  // Sends request_ on an idle connection (with `reuse_idle`), or a new one if there is none
  // or the idle ones fail; false (and error_ set) on failure.
  bool Transmit(bool reuse_idle);
  // Writes request_ to fd_; false (fd_ still open) on failure, with the reason in *error.
  bool WriteRequest(std::string* error);
  // The response ended whole: its connection goes back to connections_ if it may carry
  // another request, and is closed otherwise.
  void FinishConnection();
  // Parses the head at the start of in_ (whole); false (error_ set) if it is malformed.
  bool ParseHead(size_t head_size);
  // Appends what the node sends to in_, waiting for it until `deadline`: bytes read, 0 at the
  // deadline, -1 when the node closed the connection or it failed. Without `wait`, one read of
  // what is there (0 if nothing is).
  ssize_t Fill(Deadline deadline, bool wait = true);
  // Pop (`wait`) or PopReady.
  Next PopWithin(std::string* data, Deadline deadline, bool wait);
  // Takes the body bytes in in_ into *data; true once the body is complete.
  bool TakeBody(std::string* data);
  void Fail(std::string error);

  const NodeAddress node_;
  const UpstreamTimeouts timeouts_;
  UpstreamConnections* const connections_;
  int fd_ = -1;
  bool reused_ = false;  // fd_ came from connections_
  // The request as sent, kept until the node answers, in case a reused connection turns out
  // to be closed at the node's end and the request must go out again on a new one.
  std::string request_;
  bool answered_ = false;    // the node sent a byte of its response
  bool keep_alive_ = false;  // the connection may carry another request after this one
  Duration node_keep_alive_ = Duration::zero();  // the node's idle timeout, if it said one
  std::string in_;                               // read from the node, not yet taken
  std::optional<UpstreamHead> head_;
  Body body_ = Body::kNone;
  uint64_t body_left_ = 0;  // kLength
  std::optional<http::ChunkedBodyScanner> chunks_;
  bool done_ = false;  // the body is complete
  bool connect_failed_ = false;
  std::string error_;  // set once the exchange broke
};

}  // namespace pdserve::router
