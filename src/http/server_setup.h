// Server setup shared by node and router: one function gives an http::Server its limits,
// deadlines, connection handling, TCP_NODELAY, request ids, API-key check and OpenAI-shaped errors
// for what httplib rejects itself; one binds it. Call both from the owning thread before the server
// listens; the handlers they install run on the server's pool and share no state.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include <httplib.h>

#include "common/clock.h"
#include "common/status.h"
#include "http/api_error.h"
#include "http/server.h"

namespace pdserve::http {

// Calls setter(seconds, microseconds) with `d`: httplib's timeout setters (server and client)
// take the two parts.
template <typename Setter>
void SetTimeout(Duration d, Setter setter) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(d).count();
  setter(static_cast<time_t>(us / 1000000), static_cast<time_t>(us % 1000000));
}

struct ServerConfig {
  // Requests served at once (a stream holds its thread for its whole length). Idle connections
  // and ones whose request head is still arriving hold no thread (http/connection_pool.h).
  int threads = 64;
  // Open connections; a new one over the cap is answered 503 (Retry-After) and closed. Lowered
  // to half the process's open-file limit where that is smaller.
  size_t max_connections = 4096;
  // A request head (request line and headers) must arrive whole within this, counted from the
  // connection's accept or the request's first byte: slowloris clients are cut off with 408.
  Duration header_timeout = std::chrono::seconds(10);
  size_t max_body_bytes = size_t{4} << 20;
  // Bodies of routes added with AddPostRoute, whatever their framing (Content-Length, chunked,
  // or until the client closes); larger ones get 413 and the connection closes.
  // Request line and header lines are capped by httplib at build time (8 KiB each,
  // CPPHTTPLIB_REQUEST_URI_MAX_LENGTH / CPPHTTPLIB_HEADER_MAX_LENGTH); longer ones get 414/431.
  // A head longer than this (all its lines) gets 431 before it is parsed.
  size_t max_head_bytes = 64 * 1024;
  Duration read_timeout = std::chrono::seconds(30);   // a client silent this long is dropped
  Duration write_timeout = std::chrono::seconds(30);  // a client not reading this long, too
  Duration keep_alive_timeout = std::chrono::seconds(5);
  // Requests per connection. Not httplib's 5: a node's main client is its router, which keeps
  // its connections to nodes for request after request (router/upstream_connections.h), and
  // an idle connection costs no thread here.
  size_t keep_alive_max_requests = 1000;
  std::string api_key;  // non-empty: "Authorization: Bearer <key>" required
  // Paths under /internal/ need a proof of this secret instead of the API key
  // (http/cluster_auth.h); empty: they answer 403.
  std::string cluster_key;
  // Paths served without the key, so that probes and scrapers need none.
  std::vector<std::string> open_paths = {"/health", "/ready", "/metrics"};
  // httplib listens with a backlog of 5; bursts of clients need more (see BindServer).
  int listen_backlog = 1024;
};

// Applies `config` to `server` and installs its pre-routing handler (request id, API key or
// cluster proof for /internal/ — checked against the body, and each proof taken once — and
// 413 at once for a declared Content-Length over the limit), error handler
// (404/405/413/414/431/400 from httplib in the OpenAI shape), exception handler (500 with the
// request id; the exception's text goes to the log only) and post-routing handler (HTTP/1.0
// clients get streams without chunked framing, ended by closing the connection). Call before
// adding routes' own handlers of those kinds (there are none elsewhere).
void ConfigureServer(Server& server, const ServerConfig& config);

// A POST route: its path pattern (a regex, as httplib::Server::Post takes) and its handler,
// which sees the request with its body read whole (http::Server reads it, under the body
// limit, whatever its framing).
struct PostRoute {
  std::string pattern;
  httplib::Server::Handler handler;
};

// Adds every POST route of `server`, then a last route that answers any other POST 404. The
// routes take JSON: a body of another media type (see TakesJson) gets 415 naming the type
// taken. Call once, after ConfigureServer, with all POST routes.
void AddPostRoutes(Server& server, std::vector<PostRoute> routes);

// Whether a body sent as `content_type` is read as the JSON the routes take: none given,
// application/json or application/*+json, and the types simple clients send JSON under
// (curl -d: application/x-www-form-urlencoded; fetch with a string: text/plain). Parameters
// (charset=...) and case do not matter; anything else (a form from curl -F, XML, bytes) is not.
bool TakesJson(std::string_view content_type);

// Binds host:port (port 0: any free port) and raises the listen backlog to
// `config.listen_backlog`. Returns the bound port; Unavailable names the address on failure.
Result<int> BindServer(httplib::Server& server, const std::string& host, int port,
                       const ServerConfig& config);

// Answers `res` with `error`: its status, JSON body and, for 429/503, Retry-After.
void SendError(httplib::Response& res, const ApiError& error);

// SendError, then closes the connection: for answers to requests whose body was not read
// (over the limit), or after which the connection should not go on. What the client still sends is
// read and discarded for a bounded time first (see http/lingering_close.h).
void SendErrorAndClose(httplib::Response& res, const ApiError& error);

// Whether `req` carries "Authorization: Bearer <api_key>" (compared in constant time); true
// when `api_key` is empty.
bool HasApiKey(const httplib::Request& req, const std::string& api_key);

// The id ConfigureServer's pre-routing handler chose for the request `res` answers.
std::string RequestIdOf(const httplib::Response& res);

}  // namespace pdserve::http
