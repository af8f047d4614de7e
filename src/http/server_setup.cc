#include "http/server_setup.h"

#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdlib>
#include <exception>

#include "common/logging.h"
#include "http/request_id.h"

namespace pdserve::http {
namespace {

template <typename Setter>
void SetTimeout(Duration d, Setter setter) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(d).count();
  setter(static_cast<time_t>(us / 1000000), static_cast<time_t>(us % 1000000));
}

// Compares without an early exit, so the time taken says nothing about the key.
bool SameKey(const std::string& given, const std::string& expected) {
  unsigned diff = given.size() == expected.size() ? 0u : 1u;
  for (size_t i = 0; i < given.size(); ++i) {
    diff |= static_cast<unsigned char>(given[i]) ^
            static_cast<unsigned char>(expected[i % std::max<size_t>(1, expected.size())]);
  }
  return diff == 0;
}

// cpp-httplib (Debian's 0.11 build) listens with a backlog of 5, so a burst of clients (64
// streams opened at once, a router's retries) overflows the accept queue and some see their
// connection reset. Linux lets listen() on a listening socket change its backlog; httplib does
// not expose its socket, so find it: the listening TCP socket bound to `port`.
void RaiseListenBacklog(int port, int backlog) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return;
  while (dirent* e = readdir(dir)) {
    const int fd = std::atoi(e->d_name);
    if (fd <= 2 || fd == dirfd(dir)) continue;
    int listening = 0;
    socklen_t len = sizeof(listening);
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) continue;
    sockaddr_storage addr{};
    socklen_t alen = sizeof(addr);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0) continue;
    int bound = -1;
    if (addr.ss_family == AF_INET) bound = ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    if (addr.ss_family == AF_INET6) {
      bound = ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
    }
    if (bound == port && ::listen(fd, backlog) == 0) {
      PD_LOG_DEBUG("listen backlog of port {} raised to {}", port, backlog);
    }
  }
  closedir(dir);
}

}  // namespace

void SendError(httplib::Response& res, const ApiError& error) {
  res.status = error.http_status;
  if (error.retry_later()) res.set_header("Retry-After", "1");
  res.set_content(error.ToJson(), "application/json");
}

std::string RequestIdOf(const httplib::Response& res) {
  return res.get_header_value(kRequestIdHeader);
}

void ConfigureServer(httplib::Server& server, const ServerConfig& config) {
  const int threads = std::max(1, config.threads);
  server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server.set_payload_max_length(config.max_body_bytes);
  SetTimeout(config.read_timeout, [&](time_t s, time_t us) { server.set_read_timeout(s, us); });
  SetTimeout(config.write_timeout, [&](time_t s, time_t us) { server.set_write_timeout(s, us); });
  server.set_keep_alive_timeout(std::max<time_t>(
      1, std::chrono::duration_cast<std::chrono::seconds>(config.keep_alive_timeout).count()));
  server.set_keep_alive_max_count(config.keep_alive_max_requests);
  // Set on the listening socket; Linux copies it to every accepted socket (tested in
  // tests/server/http_common_test.cc), so small SSE events leave at once, not after Nagle's
  // wait for an ACK.
  server.set_tcp_nodelay(true);

  server.set_pre_routing_handler([api_key = config.api_key, open_paths = config.open_paths](
                                     const httplib::Request& req, httplib::Response& res) {
    res.set_header(kRequestIdHeader, ChooseRequestId(req.get_header_value(kRequestIdHeader)));
    const bool open = std::find(open_paths.begin(), open_paths.end(), req.path) != open_paths.end();
    if (api_key.empty() || open ||
        SameKey(req.get_header_value("Authorization"), "Bearer " + api_key)) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    SendError(res, ApiError::Unauthorized());
    return httplib::Server::HandlerResponse::Handled;
  });
  // Statuses httplib sets itself (no route, body too large, bad request line) get the OpenAI
  // shape; answers a handler already wrote (a relayed node error, a stream) are left alone.
  server.set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty() || res.content_length_ > 0 || res.is_chunked_content_provider_) {
          return httplib::Server::HandlerResponse::Unhandled;
        }
        SendError(res, res.status == 404 ? ApiError::NotFound(req.method, req.path)
                                         : ApiError::ForHttpStatus(res.status));
        return httplib::Server::HandlerResponse::Handled;
      }));
  server.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown exception";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        PD_LOG_ERROR("HTTP handler exception: {}", what);
        SendError(res, ApiError::Internal(what));
      });
}

Result<int> BindServer(httplib::Server& server, const std::string& host, int port,
                       const ServerConfig& config) {
  if (port < 0 || port > 65535) {
    return Status::InvalidArgument("port " + std::to_string(port) + " out of range");
  }
  int bound = -1;
  if (port == 0) {
    bound = server.bind_to_any_port(host);
  } else if (server.bind_to_port(host, port)) {
    bound = port;
  }
  if (bound <= 0) {
    return Status::Unavailable("cannot listen on " + host + ":" +
                               (port == 0 ? std::string("<any>") : std::to_string(port)) +
                               " (in use?)");
  }
  RaiseListenBacklog(bound, config.listen_backlog);
  return bound;
}

}  // namespace pdserve::http
