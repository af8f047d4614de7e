// The router's relay of streamed (SSE) answers: one thread moves the events of every open
// stream from its node connection to its client connection. It waits for all of them in one
// epoll set, so a decode step's events for many streams, arriving together, cost the router
// one wake-up rather than one per stream (with a thread per stream, the thread switches were
// most of the relay's cost: docs/benchmarks.md, "Router relay overhead").
//
// The handler thread that answers the client stays where httplib needs it: it hands the
// stream over (Relay), sleeps until the stream ends, and finishes the response itself (the
// last chunk, or an error event). Events go out whole (an event split across reads waits for
// its end), as HTTP/1.1 chunks, written without blocking; a client that does not read stops
// the relay's reads from its node (TCP's back-pressure reaches the node) until it does, or
// until the stall limit. A client closing its side ends its stream at once.
//
// Thread-safety: Relay and AbortAll from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/status.h"
#include "router/router_upstream.h"

namespace pdserve::router {

struct RelayOptions {
  Duration silence = std::chrono::seconds(600);      // longest the node may send nothing
  Duration client_stall = std::chrono::seconds(30);  // longest a client may leave bytes unread
};

struct RelayEnd {
  enum class Reason {
    kComplete,        // the node's body ended and every byte reached the client
    kClientGone,      // the client closed its side, or a write to it failed or stalled
    kUpstreamBroken,  // the node's connection broke or the body was malformed (detail says)
    kUpstreamSilent,  // nothing from the node for RelayOptions::silence
    kAborted,         // AbortAll
  };
  Reason reason = Reason::kComplete;
  std::string detail;
  size_t bytes = 0;             // event bytes written to the client
  bool saw_done = false;        // the node's "[DONE]" event was among them
  bool upstream_error = false;  // an error event was among them
};

class RelayLoop {
 public:
  // Starts the loop's thread.
  static Result<std::unique_ptr<RelayLoop>> Start(RelayOptions options);
  ~RelayLoop();  // AbortAll, then joins the thread
  RelayLoop(const RelayLoop&) = delete;
  RelayLoop& operator=(const RelayLoop&) = delete;

  // Relays `exchange`'s body (its head already read) to the client connection `client_fd`,
  // whose response head went out, and returns when the stream ended and why. The exchange and
  // the socket are the loop's until then; on return the loop holds neither. Nothing is written
  // after the last event: the caller ends the chunked body (or adds an error event).
  RelayEnd Relay(UpstreamExchange& exchange, int client_fd);
  // Ends every open stream (kAborted) and every later one at once. Idempotent.
  void AbortAll();

 private:
  struct Stream;
  explicit RelayLoop(RelayOptions options) : options_(options) {}
  void Run();
  // Takes in the streams Relay queued; false once aborted.
  void AdoptQueued();
  // Reads what the stream's node sent and writes its whole events to the client.
  void Pump(Stream& s);
  // Writes what the client has not taken yet, without blocking.
  void Flush(Stream& s);
  // Watches the node socket (`reading`) or the client's room to write (otherwise).
  void Watch(Stream& s, bool reading);
  void End(Stream& s, RelayEnd::Reason reason, std::string detail = {});
  void CheckDeadlines();

  const RelayOptions options_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: a stream queued, or AbortAll
  std::atomic<bool> aborted_{false};
  Mutex mu_;
  std::deque<std::shared_ptr<Stream>> queued_ GUARDED_BY(mu_);
  uint64_t next_id_ = 1;  // loop thread only, as streams_
  std::unordered_map<uint64_t, std::shared_ptr<Stream>> streams_;
  std::thread thread_;
};

}  // namespace pdserve::router
