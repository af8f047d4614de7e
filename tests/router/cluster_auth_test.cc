// A cluster's keys: registration with the router needs a proof of the cluster secret (none,
// a wrong one or a stale one is refused, and a router without a secret refuses them all); a
// router with an API key names no node port on its open /metrics; and `pdserve up --api-key`
// makes its nodes ask for the key on their own ports, handed over by environment, not argv.
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "http/cluster_auth.h"
#include "router/router.h"
#include "router/router_in_process.h"
#include "testing/cluster_processes.h"
#include "testing/processes.h"
#include "testing/test_paths.h"

namespace pdserve::router {
namespace {

using nlohmann::json;

constexpr char kRegister[] = "/internal/register";

std::string RegistrationBody(const std::string& node_url) { return json{{"url", node_url}}.dump(); }

// A proof under `secret` for registering `node_url`.
httplib::Headers ProofFor(const std::string& secret, const std::string& node_url) {
  return http::ClusterAuthHeaders(secret, "POST", kRegister, RegistrationBody(node_url));
}

httplib::Result Register(int router_port, const httplib::Headers& headers,
                         const std::string& node_url) {
  httplib::Client client("127.0.0.1", router_port);
  client.set_read_timeout(10, 0);
  return client.Post(kRegister, headers, RegistrationBody(node_url), "application/json");
}

std::string ErrorCode(const httplib::Result& r) {
  if (!r) return "<no response>";
  json body = json::parse(r->body, nullptr, false);
  if (!body.contains("error")) return "<no error: " + r->body + ">";
  return body["error"].value("code", "");
}

TEST(ClusterAuthTest, RegistrationNeedsTheClusterSecret) {
  RouterOptions options;
  options.cluster_key = "the-secret";
  options.api_key = "user-key";  // internal routes take the cluster proof, not the API key
  auto router = StartRouter(options);
  ASSERT_TRUE(router);
  const int port = router->port();
  const std::string fake = "http://127.0.0.1:9";  // where a thief would want prompts sent

  auto r = Register(port, {}, fake);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(ErrorCode(r), "invalid_cluster_proof");

  r = Register(port, ProofFor("wrong-secret", fake), fake);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401) << "a proof under another secret was accepted";

  // The API key is no substitute for the cluster secret.
  r = Register(port, {{"Authorization", "Bearer user-key"}}, fake);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);

  // A proof for another path, or an old one, does not carry over.
  r = Register(
      port,
      http::ClusterAuthHeaders("the-secret", "POST", "/internal/other", RegistrationBody(fake)),
      fake);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401) << "a proof made for another path was accepted";
  const int64_t stale = http::UnixNow() - 3 * http::kClusterProofWindow.count();
  r = Register(
      port,
      http::ClusterAuthHeaders("the-secret", "POST", kRegister, RegistrationBody(fake), stale),
      fake);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401) << "a stale proof was accepted";
  EXPECT_EQ(router->nodes().Size(), 0) << "a refused registration added a node";

  r = Register(port, ProofFor("the-secret", fake), fake);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(router->nodes().Size(), 1);
}

// A proof seen on the wire (internal traffic is plain HTTP) is good for nothing else: not for
// another body (a thief's URL), nor for the same request again. Fresh proofs keep working,
// several within one second.
TEST(ClusterAuthTest, ProofsCoverTheBodyAndAreSingleUse) {
  RouterOptions options;
  options.cluster_key = "the-secret";
  auto router = StartRouter(options);
  ASSERT_TRUE(router);
  const int port = router->port();
  const std::string node = "http://127.0.0.1:9";
  const httplib::Headers seen = ProofFor("the-secret", node);
  auto r = Register(port, seen, node);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  r = Register(port, seen, "http://127.0.0.1:10");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401) << "a proof was taken for another body";
  EXPECT_EQ(ErrorCode(r), "invalid_cluster_proof");
  r = Register(port, seen, node);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401) << "a proof was accepted twice";
  EXPECT_EQ(router->nodes().Size(), 1);
  for (int i = 0; i < 3; ++i) {
    const std::string url = "http://127.0.0.1:" + std::to_string(20 + i);
    r = Register(port, ProofFor("the-secret", url), url);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
  }
  EXPECT_EQ(router->nodes().Size(), 4);
}

TEST(ClusterAuthTest, RouterWithoutASecretRefusesRegistration) {
  auto router = StartRouter(RouterOptions());
  ASSERT_TRUE(router);
  auto r = Register(router->port(), {}, "http://127.0.0.1:9");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 403);
  EXPECT_EQ(ErrorCode(r), "internal_disabled");
  r = Register(router->port(), ProofFor("", "http://127.0.0.1:9"), "http://127.0.0.1:9");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 403) << "a proof under the empty secret was accepted";
  EXPECT_EQ(router->nodes().Size(), 0);
}

TEST(ClusterAuthTest, OpenMetricsNameNoNodePortWhenAKeyIsSet) {
  RouterOptions options;
  options.api_key = "user-key";
  options.nodes = {"http://127.0.0.1:45678"};
  auto router = StartRouter(options);
  ASSERT_TRUE(router);
  httplib::Client client("127.0.0.1", router->port());
  auto open = client.Get("/metrics");
  ASSERT_TRUE(open);
  EXPECT_EQ(open->status, 200);
  EXPECT_NE(open->body.find("pdserve:router_node_healthy{"), std::string::npos) << open->body;
  EXPECT_EQ(open->body.find("45678"), std::string::npos) << open->body;
  auto authorized = client.Get("/metrics", {{"Authorization", "Bearer user-key"}});
  ASSERT_TRUE(authorized);
  EXPECT_NE(authorized->body.find("http://127.0.0.1:45678"), std::string::npos)
      << "an authorized scrape should still see the node urls";
}

TEST(ClusterAuthTest, UpNodesRequireTheApiKeyOnTheirOwnPorts) {
  const std::string model = testing::TinyModelDir();
  ASSERT_FALSE(model.empty());
  const std::string key = "up-test-key-5d1f";
  testing::Subprocess up({testing::BinaryPath("src/cli/pdserve"), "up", "--model", model, "--nodes",
                          "2", "--port", "0", "--threads-per-node", "1", "--kv-cache-mb", "64",
                          "--api-key", key});
  auto line = up.ReadLineContaining("ready at", Deadline::AfterMs(120000));
  ASSERT_TRUE(line.has_value()) << "pdserve up did not print its ready line";
  std::smatch m;
  ASSERT_TRUE(std::regex_search(*line, m, std::regex(R"(http://[^:]+:(\d+))"))) << *line;
  const int router_port = std::stoi(m[1]);

  // The node urls, from an authorized scrape of the router.
  httplib::Client router("127.0.0.1", router_port);
  auto metrics = router.Get("/metrics", {{"Authorization", "Bearer " + key}});
  ASSERT_TRUE(metrics);
  std::vector<int> node_ports;
  const std::regex node_re(R"re(router_node_healthy\{node="http://127\.0\.0\.1:(\d+)"\})re");
  for (auto it = std::sregex_iterator(metrics->body.begin(), metrics->body.end(), node_re);
       it != std::sregex_iterator(); ++it) {
    node_ports.push_back(std::stoi((*it)[1]));
  }
  ASSERT_EQ(node_ports.size(), 2u) << metrics->body;

  const std::string body = R"({"prompt": "Hello", "max_tokens": 4})";
  for (int port : node_ports) {
    httplib::Client node("127.0.0.1", port);
    node.set_read_timeout(60, 0);
    auto keyless = node.Post("/v1/completions", body, "application/json");
    ASSERT_TRUE(keyless);
    EXPECT_EQ(keyless->status, 401) << "node on port " << port << " served without the key";
    auto keyed = node.Post("/v1/completions", {{"Authorization", "Bearer " + key}}, body,
                           "application/json");
    ASSERT_TRUE(keyed);
    EXPECT_EQ(keyed->status, 200) << keyed->body;
  }
  // The key reaches the nodes by environment: argv is readable by every local user.
  for (pid_t child : testing::ChildrenOf(up.pid())) {
    const std::string cmdline = testing::ProcFile(child, "cmdline");
    EXPECT_FALSE(cmdline.empty());
    EXPECT_EQ(cmdline.find(key), std::string::npos) << "the API key is in a node's argv";
  }
  // up's router takes no unsigned registration.
  auto r = Register(router_port, {}, "http://127.0.0.1:9");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  up.Signal(SIGTERM);
  EXPECT_TRUE(up.Wait(Deadline::AfterMs(60000)).has_value());
}

}  // namespace
}  // namespace pdserve::router
