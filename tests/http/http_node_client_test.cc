// Tests of the cluster's own HTTP calls (http/node_client.h) against a real http::Server on
// 127.0.0.1 set up as node and router set theirs up, and of the registration body
// (http/registration_body.h) that nodes send and routers and decode nodes parse.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "http/node_client.h"
#include "http/registration_body.h"
#include "http/server_setup.h"

namespace pdserve::http {
namespace {

using nlohmann::json;

constexpr char kClusterKey[] = "cluster-secret";

class NodeClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerConfig config;
    config.threads = 4;
    config.cluster_key = kClusterKey;
    ConfigureServer(server_, config);
    AddPostRoutes(server_,
                  {{"/internal/register", [](const httplib::Request& req, httplib::Response& res) {
                      ApiResult<NodeAddress> node = ParseRegistrationBody(req.body);
                      if (!node.ok()) return SendError(res, node.error());
                      res.set_content(node.value().url, "text/plain");
                    }}});
    server_.Get("/health", [](const httplib::Request& req, httplib::Response& res) {
      res.set_content("ok " + req.get_param_value("q"), "text/plain");
    });
    server_.Get("/busy", [](const httplib::Request&, httplib::Response& res) {
      SendError(res, ApiError::Overloaded("later"));
    });
    server_.Get("/internal/where", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("here", "text/plain");
    });
    server_.Get("/slow", [](const httplib::Request&, httplib::Response& res) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      res.set_content("late", "text/plain");
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

  Server server_;
  int port_ = 0;
  std::thread thread_;
};

// A port on 127.0.0.1 that nothing listens on (bound, never listening, while the test runs).
class ClosedPort {
 public:
  ClosedPort() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port_ = ntohs(addr.sin_port);
    }
  }
  ~ClosedPort() { close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

TEST_F(NodeClientTest, GetAnswersWithStatusAndBody) {
  Result<NodeReply> reply = NodeGet(LocalNode(port_), "/health?q=1");
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->status, 200);
  EXPECT_EQ(reply->body, "ok 1");
  // Any status is an answer; NodeGetOk takes only 200.
  reply = NodeGet(LocalNode(port_), "/busy");
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->status, 503);
  EXPECT_EQ(json::parse(reply->body)["error"]["code"], "server_overloaded");
  Result<std::string> body = NodeGetOk(LocalNode(port_), "/health");
  ASSERT_TRUE(body.ok());
  EXPECT_EQ(*body, "ok ");
  body = NodeGetOk(LocalNode(port_), "/busy");
  ASSERT_FALSE(body.ok());
  EXPECT_NE(body.status().message().find("HTTP 503"), std::string::npos)
      << body.status().ToString();
}

TEST_F(NodeClientTest, InternalRoutesNeedTheClusterKey) {
  EXPECT_EQ(NodeGet(LocalNode(port_), "/internal/where")->status, 401);
  NodeCallOptions options;
  options.cluster_key = "another-secret";
  EXPECT_EQ(NodeGet(LocalNode(port_), "/internal/where", options)->status, 401);
  options.cluster_key = kClusterKey;
  Result<NodeReply> reply = NodeGet(LocalNode(port_), "/internal/where", options);
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->status, 200);
  EXPECT_EQ(reply->body, "here");
}

TEST_F(NodeClientTest, PostSendsASignedRegistration) {
  Result<NodeAddress> node = ParseNodeUrl("10.0.0.7:8001");
  ASSERT_TRUE(node.ok());
  NodeCallOptions options;
  options.cluster_key = kClusterKey;
  Result<NodeReply> reply =
      NodePost(LocalNode(port_), "/internal/register", RegistrationBody(*node), options);
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->status, 200) << reply->body;
  EXPECT_EQ(reply->body, "http://10.0.0.7:8001");
  // The proof covers the body: a body it was not made for is refused.
  reply = NodePost(LocalNode(port_), "/internal/register", "{\"url\": 1}", options);
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->status, 400);
  EXPECT_EQ(json::parse(reply->body)["error"]["code"], "invalid_registration");
}

TEST_F(NodeClientTest, NoAnswerIsUnavailableNamingTheNodeAndPath) {
  ClosedPort closed;
  ASSERT_GT(closed.port(), 0);
  Result<NodeReply> reply = NodeGet(LocalNode(closed.port()), "/health");
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(reply.status().message().find(LocalNode(closed.port()).url + "/health"),
            std::string::npos)
      << reply.status().ToString();
  // An answer slower than the timeout is none.
  NodeCallOptions options;
  options.timeout = std::chrono::milliseconds(300);
  const TimePoint start = Clock::now();
  reply = NodeGet(LocalNode(port_), "/slow", options);
  EXPECT_FALSE(reply.ok());
  EXPECT_LT(SecondsSince(start), 1.4);
}

TEST(LocalNodeTest, NamesLoopback) {
  const NodeAddress node = LocalNode(8123);
  EXPECT_EQ(node.host, "127.0.0.1");
  EXPECT_EQ(node.port, 8123);
  EXPECT_EQ(node.url, "http://127.0.0.1:8123");
  EXPECT_EQ(ParseNodeUrl(node.url)->url, node.url);
}

TEST(RegistrationBodyTest, RoundTrips) {
  for (const char* url : {"http://127.0.0.1:8001", "node-3.cluster:9000", "http://[::1]:80/"}) {
    Result<NodeAddress> node = ParseNodeUrl(url);
    ASSERT_TRUE(node.ok()) << url;
    const std::string body = RegistrationBody(*node);
    EXPECT_EQ(json::parse(body), json({{"url", node->url}}));
    ApiResult<NodeAddress> parsed = ParseRegistrationBody(body);
    ASSERT_TRUE(parsed.ok()) << body << ": " << parsed.error().message;
    EXPECT_EQ(parsed.value().url, node->url);
    EXPECT_EQ(parsed.value().host, node->host);
    EXPECT_EQ(parsed.value().port, node->port);
  }
  // Members it does not know are left alone (a newer node may say more).
  ApiResult<NodeAddress> parsed =
      ParseRegistrationBody(R"({"url": "http://10.1.2.3:7", "role": "prefill"})");
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed.value().url, "http://10.1.2.3:7");
}

TEST(RegistrationBodyTest, RefusesBadBodiesSayingWhy) {
  struct Case {
    std::string body;
    std::string why;  // in the message
  };
  const Case cases[] = {
      {"", "not JSON"},
      {"{\"url\": ", "not JSON"},
      {"[\"http://a:1\"]", "not a JSON object"},
      {"\"http://a:1\"", "not a JSON object"},
      {"{}", "no \"url\""},
      {"{\"uri\": \"http://a:1\"}", "no \"url\""},
      {"{\"url\": 5}", "\"url\" is not a string"},
      {"{\"url\": null}", "\"url\" is not a string"},
      {"{\"url\": \"https://a:1\"}", "https is not supported"},
      {"{\"url\": \"ftp:x\"}", "bad port"},
      {"{\"url\": \"http://a\"}", "expected http://host:port"},
      {"{\"url\": \"http://a:99999\"}", "bad port"},
      {"{\"url\": \"http://a b:1\"}", "bad host"},
  };
  for (const Case& c : cases) {
    ApiResult<NodeAddress> parsed = ParseRegistrationBody(c.body);
    ASSERT_FALSE(parsed.ok()) << c.body;
    const ApiError& e = parsed.error();
    EXPECT_EQ(e.http_status, 400) << c.body;
    EXPECT_EQ(e.code, "invalid_registration") << c.body;
    EXPECT_EQ(e.param, "url") << c.body;
    EXPECT_NE(e.message.find(c.why), std::string::npos) << c.body << ": " << e.message;
    EXPECT_NE(e.message.find("http://host:port"), std::string::npos) << e.message;
  }
}

}  // namespace
}  // namespace pdserve::http
