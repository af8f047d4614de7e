#include "http/server_setup.h"

#include <dirent.h>
#include <netinet/in.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <utility>

#include "common/logging.h"
#include "common/sha256.h"
#include "http/cluster_auth.h"
#include "http/cluster_proof_cache.h"
#include "http/lingering_close.h"
#include "http/request_id.h"

namespace pdserve::http {
namespace {

// Compares digests in constant time: neither where the given key first differs nor the
// expected key's length shows in the time taken.
bool SameKey(const std::string& given, const std::string& expected) {
  return ConstantTimeEqual(Sha256Hash(given), Sha256Hash(expected));
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

// The declared body length, or nullopt without a (numeric) Content-Length.
std::optional<uint64_t> DeclaredLength(const httplib::Request& req) {
  if (!req.has_header("Content-Length")) return std::nullopt;
  const std::string value = req.get_header_value("Content-Length");
  if (value.empty() || value.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  errno = 0;
  const uint64_t n = std::strtoull(value.c_str(), nullptr, 10);
  return errno == ERANGE ? UINT64_MAX : n;
}

// Whether httplib failed reading the request's head, before routing (the pre-routing handler,
// which sets the request id, has not run): its rest is unread, so the connection must close.
bool HeadUnreadable(const httplib::Response& res) {
  return res.status == 400 && !res.has_header(kRequestIdHeader);
}

// Of those failures, a bad request line leaves req.path empty; the others are a header line
// over CPPHTTPLIB_HEADER_MAX_LENGTH or a head cut short (the client went away: no one reads
// the answer).
bool HeaderTooLarge(const httplib::Request& req) { return !req.path.empty(); }

// Runs last, on the answer's head. HTTP/1.0 knows no chunked framing: a stream goes out as it
// is, ended by closing the connection. httplib closes after the answer unless the client sent
// "Connection: Keep-Alive" (compared exactly, as httplib does); then the stream ends with the
// keep-alive timeout. An answer that closes the connection says so once, without Keep-Alive.
void FinishHead(const httplib::Request& req, httplib::Response& res) {
  if (req.version == "HTTP/1.0") {
    if (res.is_chunked_content_provider_) {
      res.is_chunked_content_provider_ = false;
      res.headers.erase("Transfer-Encoding");
    }
    if (req.get_header_value("Connection") != "Keep-Alive") res.set_header("Connection", "close");
  }
  if (res.get_header_value("Connection") == "close") {
    res.headers.erase("Connection");
    res.headers.erase("Keep-Alive");
    res.set_header("Connection", "close");
  }
}

// Why a route does not take `req`'s body (415), or "" if it does.
std::string BodyRefusal(const httplib::Request& req) {
  const std::string type = req.get_header_value("Content-Type");
  if (!TakesJson(type)) {
    return "Content-Type '" + type +
           "' is not accepted: send the body as JSON (Content-Type: application/json)";
  }
  // httplib decoded compressed bodies as it read them; http::Server hands bodies over as sent.
  const std::string encoding = req.get_header_value("Content-Encoding");
  if (!encoding.empty() && strcasecmp(encoding.c_str(), "identity") != 0) {
    return "Content-Encoding '" + encoding + "' is not accepted: send the body uncompressed";
  }
  return "";
}

// What an /internal/ request is answered when its proof is refused: `proof` failed, or
// verified but was taken before (a replay).
ApiError ProofRefusal(const Result<ClusterProofStamp>& proof) {
  if (proof.ok()) return ApiError::ClusterProofRejected("cluster proof already used (a replay)");
  if (proof.status().code() == StatusCode::kFailedPrecondition) {
    return ApiError::InternalDisabled(proof.status().message());
  }
  return ApiError::ClusterProofRejected(proof.status().message());
}

}  // namespace

void SendError(httplib::Response& res, const ApiError& error) {
  res.status = error.http_status;
  if (error.retry_later()) res.set_header("Retry-After", std::to_string(error.retry_after_s));
  res.set_content(error.ToJson(), "application/json");
}

void SendErrorAndClose(httplib::Response& res, const ApiError& error) {
  res.status = error.http_status;
  if (error.retry_later()) res.set_header("Retry-After", std::to_string(error.retry_after_s));
  res.set_header("Connection", "close");
  auto body = std::make_shared<const std::string>(error.ToJson());
  // httplib 0.11 closes a connection only when the client asked or a write failed: a provider
  // that writes the whole answer and then reports failure sends it and ends the connection,
  // after a lingering drain so that a client still sending its body reads the answer.
  res.set_content_provider(body->size(), "application/json",
                           [body](size_t offset, size_t length, httplib::DataSink& sink) {
                             if (sink.write(body->data() + offset, length)) {
                               if (const int fd = CurrentClientSocket(); fd >= 0) {
                                 DrainBeforeClose(fd, LingerLimits{});
                               }
                             }
                             return false;
                           });
}

bool TakesJson(std::string_view content_type) {
  std::string media(content_type.substr(0, content_type.find(';')));
  std::transform(media.begin(), media.end(), media.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  media.erase(0, media.find_first_not_of(" \t"));
  media.erase(media.find_last_not_of(" \t") + 1);
  return media.empty() || media == "application/json" ||
         (media.starts_with("application/") && media.ends_with("+json")) ||
         media == "application/x-www-form-urlencoded" || media == "text/plain";
}

bool HasApiKey(const httplib::Request& req, const std::string& api_key) {
  return api_key.empty() || SameKey(req.get_header_value("Authorization"), "Bearer " + api_key);
}

std::string RequestIdOf(const httplib::Response& res) {
  return res.get_header_value(kRequestIdHeader);
}

void ConfigureServer(Server& server, const ServerConfig& config) {
  ConnectionLimits limits;
  limits.threads = std::max(1, config.threads);
  limits.max_connections = std::max<size_t>(1, config.max_connections);
  // Each connection is a file descriptor: past the process's limit accept() itself fails.
  if (rlimit fds{}; getrlimit(RLIMIT_NOFILE, &fds) == 0 && fds.rlim_cur != RLIM_INFINITY) {
    limits.max_connections =
        std::clamp<size_t>(static_cast<size_t>(fds.rlim_cur / 2), 1, limits.max_connections);
  }
  limits.header_timeout = config.header_timeout;
  limits.max_head_bytes = config.max_head_bytes;
  server.SetConnectionLimits(limits);
  server.set_payload_max_length(config.max_body_bytes);
  SetTimeout(config.read_timeout, [&](time_t s, time_t us) { server.set_read_timeout(s, us); });
  SetTimeout(config.write_timeout, [&](time_t s, time_t us) { server.set_write_timeout(s, us); });
  server.set_keep_alive_timeout(std::max<time_t>(
      1, std::chrono::duration_cast<std::chrono::seconds>(config.keep_alive_timeout).count()));
  server.set_keep_alive_max_count(config.keep_alive_max_requests);
  // Set on the listening socket; Linux copies it to every accepted socket (tested in
  // tests/http/http_common_test.cc), so small SSE events leave at once, not after Nagle's
  // wait for an ACK.
  server.set_tcp_nodelay(true);

  // Proofs accepted by this server, each once (http/cluster_proof_cache.h).
  auto spent_proofs = std::make_shared<ClusterProofReplayCache>();
  server.set_pre_routing_handler([api_key = config.api_key, cluster_key = config.cluster_key,
                                  open_paths = config.open_paths, max_body = config.max_body_bytes,
                                  spent_proofs](const httplib::Request& req,
                                                httplib::Response& res) {
    res.set_header(kRequestIdHeader, ChooseRequestId(req.get_header_value(kRequestIdHeader)));
    // Refused from the header: http::Server left the body unread (it reads none over the
    // limit), so the connection closes after the answer.
    if (std::optional<uint64_t> length = DeclaredLength(req); length && *length > max_body) {
      SendErrorAndClose(res, ApiError::PayloadTooLarge());
      return httplib::Server::HandlerResponse::Handled;
    }
    // Cluster-internal endpoints answer only to the cluster's own processes, key or no key,
    // and each proof (which covers the body, read by now) only once.
    if (req.path.starts_with(kInternalPathPrefix)) {
      Result<ClusterProofStamp> proof = VerifyClusterAuth(req, cluster_key);
      if (proof.ok() && spent_proofs->Admit(*proof)) {
        return httplib::Server::HandlerResponse::Unhandled;
      }
      // Closed after the answer: whoever sends a bad proof has nothing more to say here.
      SendErrorAndClose(res, ProofRefusal(proof));
      return httplib::Server::HandlerResponse::Handled;
    }
    const bool open = std::find(open_paths.begin(), open_paths.end(), req.path) != open_paths.end();
    if (open || HasApiKey(req, api_key)) return httplib::Server::HandlerResponse::Unhandled;
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
        if (HeadUnreadable(res)) {
          // Close rather than parse the unread rest as a request.
          SendErrorAndClose(
              res, HeaderTooLarge(req) ? ApiError::HeaderTooLarge() : ApiError::ForHttpStatus(400));
          return httplib::Server::HandlerResponse::Handled;
        }
        SendError(res, res.status == 404 ? ApiError::NotFound(req.method, req.path)
                                         : ApiError::ForHttpStatus(res.status));
        return httplib::Server::HandlerResponse::Handled;
      }));
  // An exception out of a route is a bug. Its text (a C++ type name, a library's wording) says
  // nothing to a client and something to an attacker: it goes to the log under the request
  // id, and the client gets the id to quote.
  server.set_exception_handler([](const httplib::Request& req, httplib::Response& res,
                                  std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    const std::string id = RequestIdOf(res);
    PD_LOG_ERROR("request_id={} method={} path={}: exception: {}", id, req.method, req.path, what);
    SendError(res, ApiError::Internal("internal error (request id " + id + ")"));
  });
  server.set_post_routing_handler(FinishHead);
}

void AddPostRoutes(Server& server, std::vector<PostRoute> routes) {
  // Content-reader routes, so that httplib reads no body itself: http::Server has put it in
  // req.body already.
  auto route = [](httplib::Server::Handler handler, bool json) {
    return [handler = std::move(handler), json](const httplib::Request& req, httplib::Response& res,
                                                const httplib::ContentReader&) {
      if (json && !req.body.empty()) {
        if (std::string refusal = BodyRefusal(req); !refusal.empty()) {
          return SendError(res, ApiError::UnsupportedMediaType(std::move(refusal)));
        }
      }
      handler(req, res);
    };
  };
  for (PostRoute& r : routes) server.Post(r.pattern, route(std::move(r.handler), true));
  server.Post(".*", route(
                        [](const httplib::Request& req, httplib::Response& res) {
                          SendError(res, ApiError::NotFound(req.method, req.path));
                        },
                        false));
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
