// http::Server: the httplib::Server that node and router run. It replaces httplib 0.11's
// one-thread-per-connection handling with http/connection_pool.h (a poller holds idle and
// slowly arriving connections under deadlines, workers serve whole request heads, a cap
// sheds excess connections with 503) and keeps each connection's unread bytes across requests,
// so that pipelined requests are all answered, in order.
//
// Each request is read whole (head and body, within the body limit) before httplib routes it,
// where it ends decided strictly by http/request_framing.h, and handed over with its body in
// `req.body` (the pre-routing handler sees it too). Whatever a route leaves unread is
// dropped, so no answer, however early (401, a GET that ignores its body), leaves body bytes
// to be parsed as the next request; a body declared over the limit is never read, and its
// answer (413) closes the connection. Set up with ConfigureServer (http/server_setup.h) before
// it listens; used from threads as httplib::Server is.
#pragma once

#include <cstddef>

#include <httplib.h>

#include "http/connection.h"
#include "http/connection_pool.h"

namespace pdserve::http {

// The socket of the client connection whose request the calling thread is answering (in a
// route handler or a content provider of an http::Server), or -1 on any other thread. A
// handler may watch it (for the client leaving) or write a streamed body to it itself
// (router/relay_loop.h); it stays the server's, open until the handler returns.
int CurrentClientSocket();

class Server : public httplib::Server {
 public:
  Server();
  // Takes effect at the next listen. Keep-alive timeout and count, read and write timeouts
  // are httplib's own settings.
  void SetConnectionLimits(const ConnectionLimits& limits) { limits_ = limits; }

 private:
  // httplib's accept loop calls this (virtually) for each accepted socket, through the task
  // queue; it hands the socket to the pool.
  bool process_and_close_socket(socket_t sock) override;
  // Serves the requests whose heads `conn` holds whole.
  AfterServe Serve(Connection& conn);

  ConnectionLimits limits_;
  // The task queue of the running listen; set and used on the listening thread only.
  ConnectionPool* pool_ = nullptr;
};

}  // namespace pdserve::http
