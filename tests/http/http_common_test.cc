// Tests of http/: the error vocabulary, the request-id policy, SSE framing and the server
// setup node and router share (a real httplib server on 127.0.0.1).
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "common/retry_after.h"
#include "http/api_error.h"
#include "http/request_id.h"
#include "http/server_setup.h"
#include "http/sse.h"
#include "testing/raw_http_client.h"

namespace pdserve::http {
namespace {

using nlohmann::json;

TEST(ApiErrorTest, NamedConstructorsCarryStatusTypeAndCode) {
  struct Case {
    ApiError e;
    int status;
    const char* type;
    const char* code;
  };
  const Case cases[] = {
      {ApiError::InvalidRequest("m"), 400, "invalid_request_error", "invalid_value"},
      {ApiError::InvalidRequest("m", "p", "invalid_json"), 400, "invalid_request_error",
       "invalid_json"},
      {ApiError::Unauthorized(), 401, "invalid_request_error", "invalid_api_key"},
      {ApiError::NotFound("GET", "/x"), 404, "invalid_request_error", "not_found"},
      {ApiError::ModelNotFound("gpt-9"), 404, "invalid_request_error", "model_not_found"},
      {ApiError::MethodNotAllowed(), 405, "invalid_request_error", "method_not_allowed"},
      {ApiError::PayloadTooLarge(), 413, "invalid_request_error", "payload_too_large"},
      {ApiError::ContextLengthExceeded("m"), 400, "invalid_request_error",
       "context_length_exceeded"},
      {ApiError::UriTooLong(), 414, "invalid_request_error", "uri_too_long"},
      {ApiError::HeaderTooLarge(), 431, "invalid_request_error", "request_header_fields_too_large"},
      {ApiError::RateLimited("m"), 429, "rate_limit_error", "rate_limit_exceeded"},
      {ApiError::Overloaded("m"), 503, "service_unavailable_error", "server_overloaded"},
      {ApiError::Unavailable("m", "loading"), 503, "service_unavailable_error", "loading"},
      {ApiError::Timeout("m"), 504, "timeout_error", "timeout"},
      {ApiError::BadGateway("m", "upstream_broken"), 502, "server_error", "upstream_broken"},
      {ApiError::Internal("m"), 500, "internal_error", "internal_error"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.e.http_status, c.status) << c.code;
    EXPECT_EQ(c.e.type, c.type) << c.code;
    EXPECT_EQ(c.e.code, c.code);
    EXPECT_EQ(c.e.retry_later(), c.status == 429 || c.status == 503) << c.code;
  }
  EXPECT_EQ(ApiError::ModelNotFound("gpt-9").param, "model");
  EXPECT_NE(ApiError::NotFound("POST", "/v1/x").message.find("POST /v1/x"), std::string::npos);
}

TEST(ApiErrorTest, JsonHasTheOpenAiShape) {
  const json j = json::parse(ApiError::InvalidRequest("bad 'x'", "x").ToJson());
  EXPECT_EQ(j["error"]["message"], "bad 'x'");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["code"], "invalid_value");
  EXPECT_EQ(j["error"]["param"], "x");
  EXPECT_TRUE(json::parse(ApiError::Internal("m").ToJson())["error"]["param"].is_null());
  // Client bytes that are not UTF-8 are replaced, not thrown on.
  const json bad = json::parse(ApiError::NotFound("GET", "/\xff\xfe").ToJson());
  EXPECT_TRUE(bad["error"]["message"].is_string());
}

TEST(ApiErrorTest, FromStatusMapsEngineErrors) {
  EXPECT_EQ(ApiError::FromStatus(Status::InvalidArgument("x")).http_status, 400);
  EXPECT_EQ(ApiError::FromStatus(Status::OutOfRange("long")).code, "context_length_exceeded");
  EXPECT_EQ(ApiError::FromStatus(Status::ResourceExhausted("full")).http_status, 503);
  EXPECT_EQ(ApiError::FromStatus(Status::ResourceExhausted("full")).code, "server_overloaded");
  EXPECT_EQ(ApiError::FromStatus(Status::Unavailable("rank lost")).code, "service_unavailable");
  EXPECT_EQ(ApiError::FromStatus(Status::Unavailable("rank lost")).http_status, 503);
  EXPECT_EQ(ApiError::FromStatus(Status::DeadlineExceeded("late")).http_status, 504);
  EXPECT_EQ(ApiError::FromStatus(Status::Cancelled("gone")).code, "cancelled");
  EXPECT_EQ(ApiError::FromStatus(Status::Internal("bug")).http_status, 500);
  // A refusal that knows when to come back (the decode node's admission) says so in the
  // Retry-After header; any other 503 says 1 s.
  EXPECT_EQ(ApiError::FromStatus(Status::Unavailable("rank lost")).retry_after_s, 1);
  const ApiError busy = ApiError::FromStatus(WithRetryAfter(Status::Unavailable("busy"), 42));
  EXPECT_EQ(busy.http_status, 503);
  EXPECT_EQ(busy.retry_after_s, 42);
  EXPECT_TRUE(busy.retry_later());
}

TEST(RequestIdTest, PolicyKeepsShortSafeIdsOnly) {
  EXPECT_TRUE(IsSafeRequestId("abc-123"));
  EXPECT_TRUE(IsSafeRequestId("0f8c2b1e-9a3d-4c55-b0e1-7a2c9d3e4f10"));  // a UUID
  EXPECT_TRUE(IsSafeRequestId("trace:span.1_2"));
  EXPECT_TRUE(IsSafeRequestId(std::string(kMaxRequestIdLength, 'a')));
  EXPECT_FALSE(IsSafeRequestId(""));
  EXPECT_FALSE(IsSafeRequestId(std::string(kMaxRequestIdLength + 1, 'a')));
  for (const char* bad :
       {"a b", "a\"b", "a\\b", "a<b>", "{x}", "id;rm", "a/b", "caf\xc3\xa9", "a\x01", "a\tb"}) {
    EXPECT_FALSE(IsSafeRequestId(bad)) << bad;
  }
  EXPECT_EQ(ChooseRequestId("abc-123"), "abc-123");
  const std::string fresh = ChooseRequestId("a<b>");
  EXPECT_TRUE(fresh.starts_with("req-"));
  // What the router makes, the node keeps: the id survives the hop.
  std::set<std::string> ids;
  for (int i = 0; i < 100; ++i) {
    const std::string id = NewRequestId();
    EXPECT_TRUE(IsSafeRequestId(id)) << id;
    EXPECT_EQ(ChooseRequestId(id), id);
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), 100u) << "ids repeat";
}

TEST(SseTest, Framing) {
  EXPECT_EQ(SseEvent("{}"), "data: {}\n\n");
  EXPECT_EQ(std::string(kSseDone), "data: [DONE]\n\n");
  const std::string e = SseError(ApiError::Timeout("slow"));
  ASSERT_TRUE(e.starts_with("data: ") && e.ends_with("\n\n")) << e;
  const json j = json::parse(e.substr(6, e.size() - 8));
  EXPECT_EQ(j["error"]["code"], "timeout");
}

// TCP_NODELAY of the server side of the connection from `client_port` to `server_port`
// (-1 if not found): the accepted socket is found among this process's descriptors.
int AcceptedSocketNoDelay(int server_port, int client_port) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int result = -1;
  while (dirent* e = readdir(dir)) {
    const int fd = std::atoi(e->d_name);
    if (fd <= 2 || fd == dirfd(dir)) continue;
    sockaddr_in local{}, peer{};
    socklen_t llen = sizeof(local), plen = sizeof(peer);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) != 0 ||
        local.sin_family != AF_INET || ntohs(local.sin_port) != server_port) {
      continue;
    }
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) != 0 ||
        ntohs(peer.sin_port) != client_port) {
      continue;
    }
    int on = 0;
    socklen_t len = sizeof(on);
    if (getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, &len) == 0) result = on != 0 ? 1 : 0;
  }
  closedir(dir);
  return result;
}

class ServerSetupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerConfig config;
    config.threads = 4;
    config.max_body_bytes = 1024;
    config.api_key = "sekret";
    ConfigureServer(server_, config);
    AddPostRoutes(server_, {{"/echo", [](const httplib::Request& req, httplib::Response& res) {
                               res.set_content(req.body, "text/plain");
                             }}});
    // Three SSE events, as a generation streams them.
    server_.Get("/stream", [](const httplib::Request&, httplib::Response& res) {
      auto sent = std::make_shared<int>(0);
      res.set_chunked_content_provider("text/event-stream",
                                       [sent](size_t, httplib::DataSink& sink) {
                                         const std::string event = SseEvent("{}");
                                         sink.write(event.data(), event.size());
                                         if (++*sent == 3) sink.done();
                                         return true;
                                       });
    });
    server_.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok", "text/plain");
    });
    server_.Get("/throw", [](const httplib::Request&, httplib::Response&) {
      throw std::runtime_error("boom");
    });
    server_.Get("/busy", [](const httplib::Request&, httplib::Response& res) {
      SendError(res, ApiError::Overloaded("later"));
    });
    // Reports the server side's TCP_NODELAY of this very connection.
    server_.Get("/nodelay", [this](const httplib::Request& req, httplib::Response& res) {
      res.set_content(std::to_string(AcceptedSocketNoDelay(port_, req.remote_port)), "text/plain");
    });
    Result<int> port = BindServer(server_, "127.0.0.1", 0, config);
    ASSERT_TRUE(port.ok()) << port.status().ToString();
    port_ = *port;
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  void TearDown() override {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }
  httplib::Client Client() const {
    httplib::Client client("127.0.0.1", port_);
    client.set_read_timeout(10, 0);
    return client;
  }
  static void ExpectError(const httplib::Result& r, int status, const std::string& code) {
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, status) << r->body;
    const json j = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r->body;
    EXPECT_EQ(j["error"]["code"], code) << r->body;
    EXPECT_TRUE(j["error"]["message"].is_string());
    EXPECT_TRUE(j["error"]["type"].is_string());
  }

  const httplib::Headers auth_ = {{"Authorization", "Bearer sekret"}};
  Server server_;
  int port_ = 0;
  std::thread thread_;
};

TEST_F(ServerSetupTest, ApiKeyIsCheckedExceptOnOpenPaths) {
  auto client = Client();
  ExpectError(client.Post("/echo", "hi", "text/plain"), 401, "invalid_api_key");
  ExpectError(client.Post("/echo", {{"Authorization", "Bearer nope"}}, "hi", "text/plain"), 401,
              "invalid_api_key");
  ExpectError(client.Post("/echo", {{"Authorization", "Bearer sekret2"}}, "hi", "text/plain"), 401,
              "invalid_api_key");
  auto ok = client.Post("/echo", auth_, "hi", "text/plain");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(ok->body, "hi");
  auto health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200) << "probes need no key";
}

TEST_F(ServerSetupTest, HttplibErrorsGetTheOpenAiShape) {
  auto client = Client();
  ExpectError(client.Post("/nothing", auth_, "{}", "application/json"), 404, "not_found");
  ExpectError(client.Post("/echo", auth_, std::string(4096, 'x'), "text/plain"), 413,
              "payload_too_large");
  ExpectError(client.Get("/throw", auth_), 500, "internal_error");
  auto busy = client.Get("/busy", auth_);
  ExpectError(busy, 503, "server_overloaded");
  EXPECT_EQ(busy->get_header_value("Retry-After"), "1");
}

// An exception in a handler is a bug: its text is for the log, the client gets a generic 500
// that names the request id (before, the message was the exception's what(): "boom").
TEST_F(ServerSetupTest, HandlerExceptionsGetAGeneric500WithTheRequestId) {
  httplib::Headers headers = auth_;
  headers.emplace("X-Request-Id", "trace-36");
  auto r = Client().Get("/throw", headers);
  ExpectError(r, 500, "internal_error");
  EXPECT_EQ(r->body.find("boom"), std::string::npos) << r->body;
  EXPECT_NE(r->body.find("trace-36"), std::string::npos) << r->body;
}

// Routes take JSON; a form (curl -F) or another media type gets 415 naming what is taken,
// before the body is parsed (httplib's multipart reader threw into the route: 500).
TEST_F(ServerSetupTest, BodiesOfOtherMediaTypesGet415) {
  auto client = Client();
  for (const std::string type : {"multipart/form-data; boundary=b", "application/xml"}) {
    auto r = client.Post("/echo", auth_, "--b\r\n\r\nx\r\n--b--\r\n", type);
    ExpectError(r, 415, "unsupported_media_type");
    EXPECT_NE(r->body.find("application/json"), std::string::npos) << r->body;
  }
  for (const std::string type : {"application/json", "Application/JSON; charset=utf-8",
                                 "application/vnd.api+json", "text/plain"}) {
    auto r = client.Post("/echo", auth_, "{}", type);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << type << ": " << r->body;
  }
  // Bodies reach routes as sent: a compressed one is refused, not taken for JSON.
  httplib::Headers gzip = auth_;
  gzip.emplace("Content-Encoding", "gzip");
  ExpectError(client.Post("/echo", gzip, "{}", "application/json"), 415, "unsupported_media_type");
  // Unknown paths are still 404, whatever the body.
  ExpectError(client.Post("/nothing", auth_, "x", "application/xml"), 404, "not_found");
}

TEST_F(ServerSetupTest, RequestIdIsKeptWhenSafeElseMade) {
  auto client = Client();
  httplib::Headers with_id = auth_;
  with_id.emplace("X-Request-Id", "abc-123");
  auto kept = client.Post("/echo", with_id, "x", "text/plain");
  ASSERT_TRUE(kept);
  EXPECT_EQ(kept->get_header_value("X-Request-Id"), "abc-123");
  httplib::Headers bad_id = auth_;
  bad_id.emplace("X-Request-Id", std::string(100, 'x'));
  auto replaced = client.Post("/echo", bad_id, "x", "text/plain");
  ASSERT_TRUE(replaced);
  EXPECT_TRUE(replaced->get_header_value("X-Request-Id").starts_with("req-"));
  // Errors answered before routing carry an id too.
  auto refused = client.Post("/echo", "x", "text/plain");
  ASSERT_TRUE(refused);
  EXPECT_FALSE(refused->get_header_value("X-Request-Id").empty());
}

TEST_F(ServerSetupTest, AcceptedSocketsHaveTcpNoDelay) {
  auto r = Client().Get("/nodelay", auth_);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  ASSERT_NE(r->body, "-1") << "the accepted socket was not found among the descriptors";
  EXPECT_EQ(r->body, "1");
}

using testing::Chunk;
using testing::ChunkedPostHead;
using testing::RawHttpClient;
using testing::StatusOf;

const char kAuth[] = "Authorization: Bearer sekret\r\n";

// httplib 0.11 buffered a chunked body whole, whatever its size: the limit must hold for it too,
// answered as soon as it is passed (not after the client sent everything), on a known route and
// on any other POST path.
TEST_F(ServerSetupTest, ChunkedBodyOverTheLimitGets413AndTheConnectionCloses) {
  for (const std::string path : {"/echo", "/nothing"}) {
    RawHttpClient raw(port_);
    ASSERT_TRUE(raw.ok());
    std::string head = ChunkedPostHead(path);
    head.insert(head.size() - 2, kAuth);
    constexpr size_t kTotal = size_t{64} << 20;
    std::atomic<size_t> sent{0};
    std::thread sender([&] {
      if (!raw.Send(head)) return;
      const std::string chunk = Chunk(4096);
      while (sent < kTotal && raw.Send(chunk)) sent += 4096;
    });
    // The answer comes while the client is still sending; the server then drains the rest for
    // a bounded time (lingering close) so that the client can read it, and closes.
    std::string answer = raw.ReadAtLeast(12, Deadline::AfterMs(20000));
    const size_t sent_at_answer = sent.load();
    bool closed = false;
    answer += raw.ReadUntilClose(Deadline::AfterMs(20000), &closed);
    sender.join();
    EXPECT_EQ(StatusOf(answer), 413) << path << ": " << answer.substr(0, 200);
    EXPECT_NE(answer.find("payload_too_large"), std::string::npos) << answer;
    EXPECT_TRUE(closed) << path;
    EXPECT_LT(sent_at_answer, kTotal) << path << ": the server read the whole body";
  }
}

TEST_F(ServerSetupTest, ChunkedBodyUnderTheLimitIsRead) {
  RawHttpClient raw(port_);
  ASSERT_TRUE(raw.ok());
  std::string head = ChunkedPostHead("/echo");
  head.insert(head.size() - 2, std::string(kAuth) + "Connection: close\r\n");
  ASSERT_TRUE(raw.Send(head + Chunk(300) + Chunk(200) + "0\r\n\r\n"));
  bool closed = false;
  const std::string answer = raw.ReadUntilClose(Deadline::AfterMs(10000), &closed);
  EXPECT_EQ(StatusOf(answer), 200) << answer;
  EXPECT_TRUE(answer.ends_with("\r\n\r\n" + std::string(500, 'x'))) << answer;
}

// Refused from the header alone: a client that declares a huge body and sends none must not
// hold a thread until the read timeout (30 s here).
TEST_F(ServerSetupTest, DeclaredLengthOverTheLimitIsRefusedAtOnce) {
  RawHttpClient raw(port_);
  ASSERT_TRUE(raw.ok());
  ASSERT_TRUE(raw.Send(std::string("POST /echo HTTP/1.1\r\nHost: x\r\n") + kAuth +
                       "Content-Length: 100000000\r\n\r\n"));
  const TimePoint start = Clock::now();
  bool closed = false;
  const std::string answer = raw.ReadUntilClose(Deadline::AfterMs(10000), &closed);
  EXPECT_EQ(StatusOf(answer), 413) << answer;
  EXPECT_NE(answer.find("payload_too_large"), std::string::npos) << answer;
  EXPECT_TRUE(closed);
  EXPECT_LT(SecondsSince(start), 3.0);
}

// A request with neither Content-Length nor chunked framing has no body (RFC 9112 6.3).
TEST_F(ServerSetupTest, PostWithoutFramingHasAnEmptyBody) {
  RawHttpClient raw(port_);
  ASSERT_TRUE(raw.ok());
  ASSERT_TRUE(raw.Send(std::string("POST /echo HTTP/1.1\r\nHost: x\r\n") + kAuth +
                       "Connection: close\r\n\r\n"));
  bool closed = false;
  const std::string answer = raw.ReadUntilClose(Deadline::AfterMs(10000), &closed);
  EXPECT_EQ(StatusOf(answer), 200) << answer;
  EXPECT_TRUE(closed) << "the server waited for a body that was never announced";
}

TEST_F(ServerSetupTest, OversizedHeaderGets431) {
  RawHttpClient raw(port_);
  ASSERT_TRUE(raw.ok());
  ASSERT_TRUE(
      raw.Send("GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(9000, 'a') + "\r\n\r\n"));
  bool closed = false;
  const std::string answer = raw.ReadUntilClose(Deadline::AfterMs(10000), &closed);
  EXPECT_EQ(StatusOf(answer), 431) << answer;
  EXPECT_NE(answer.find("request_header_fields_too_large"), std::string::npos) << answer;
  EXPECT_TRUE(closed);
  // A malformed request line is still a plain 400.
  RawHttpClient bad(port_);
  ASSERT_TRUE(bad.Send("BREW /pot HTTP/1.1\r\n\r\n"));
  EXPECT_EQ(StatusOf(bad.ReadUntilClose(Deadline::AfterMs(10000), &closed)), 400);
}

// HTTP/1.0 has no chunked framing: the stream comes as it is, ended by the close.
TEST_F(ServerSetupTest, Http10ClientGetsAPlainStream) {
  RawHttpClient raw(port_);
  ASSERT_TRUE(raw.ok());
  ASSERT_TRUE(raw.Send(std::string("GET /stream HTTP/1.0\r\n") + kAuth + "\r\n"));
  bool closed = false;
  const std::string answer = raw.ReadUntilClose(Deadline::AfterMs(10000), &closed);
  EXPECT_TRUE(closed);
  EXPECT_EQ(StatusOf(answer), 200) << answer;
  const size_t end_of_head = answer.find("\r\n\r\n");
  ASSERT_NE(end_of_head, std::string::npos) << answer;
  const std::string head = answer.substr(0, end_of_head);
  EXPECT_EQ(head.find("Transfer-Encoding"), std::string::npos) << head;
  EXPECT_EQ(head.find("Keep-Alive"), std::string::npos) << head;
  EXPECT_NE(head.find("Connection: close"), std::string::npos) << head;
  EXPECT_EQ(answer.substr(end_of_head + 4), SseEvent("{}") + SseEvent("{}") + SseEvent("{}"));
  // HTTP/1.1 clients still get chunks.
  auto r = Client().Get("/stream", auth_);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->get_header_value("Transfer-Encoding"), "chunked");
}

}  // namespace
}  // namespace pdserve::http
