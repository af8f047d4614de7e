// The router and where its requests end (issue 36), over raw sockets, as in
// node_framing_test.cc: the body of a request answered before it was read is never parsed as
// a request, bodies the API does not take get 415, malformed heads 400 and a close at once.
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "router/router.h"
#include "testing/raw_http_client.h"

namespace pdserve::router {
namespace {

using nlohmann::json;
using testing::ChunkedBody;
using testing::EarlyAnswer;
using testing::WithChunks;
using testing::WithLength;

constexpr char kKey[] = "router-framing-key";
const std::string kAuth = std::string("Authorization: Bearer ") + kKey + "\r\n";
// If run, answered 404 "no route GET /smuggled-request"; the follow-up likewise.
const std::string kSmuggled = "GET /smuggled-request HTTP/1.1\r\nHost: x\r\n" + kAuth + "\r\n";
const std::string kFollowUp = "GET /follow-up-request HTTP/1.1\r\nHost: x\r\n" + kAuth + "\r\n";

// A router with an API key and a cluster secret, and no node (forwarded requests get 503).
class RouterFramingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RouterOptions options;
    options.port = 0;
    options.api_key = kKey;
    options.cluster_key = "router-framing-secret";
    auto router = Router::Create(options);
    ASSERT_TRUE(router.ok()) << router.status().ToString();
    router_ = std::move(*router);
    ASSERT_TRUE(router_->Start().ok());
  }
  std::unique_ptr<Router> router_;
};

TEST_F(RouterFramingTest, BodiesOfEarlyAnswersAreNeverParsedAsRequests) {
  const std::string post =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n";
  const std::vector<std::string> problems = testing::SmugglingProblems(
      router_->port(),
      [&] {
        std::vector<EarlyAnswer> cases = testing::CommonEarlyAnswers(kAuth, kSmuggled);
        cases.insert(
            cases.end(),
            {
                {"registration without a proof",
                 WithLength("POST /internal/register HTTP/1.1\r\nHost: x\r\n", kSmuggled), 401},
                {"GET with a body",
                 WithLength("GET /v1/models HTTP/1.1\r\nHost: x\r\n" + kAuth, kSmuggled), 503},
                {"open GET with a chunked body",
                 WithChunks("GET /metrics HTTP/1.1\r\nHost: x\r\n", kSmuggled), 200},
                {"DELETE with a body",
                 WithLength("DELETE /v1/models HTTP/1.1\r\nHost: x\r\n" + kAuth, kSmuggled), 0},
            });
        return cases;
      }(),
      kFollowUp, "/smuggled-request", "/follow-up-request");
  for (const std::string& p : problems) ADD_FAILURE() << p;
}

TEST_F(RouterFramingTest, FormPostsGet415) {
  httplib::Client client("127.0.0.1", router_->port());
  client.set_read_timeout(10, 0);
  httplib::Result r = client.Post(
      "/v1/completions", {{"Authorization", std::string("Bearer ") + kKey}},
      "--b\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\nhello\r\n--b--\r\n",
      "multipart/form-data; boundary=b");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 415) << r->body;
  const json j = json::parse(r->body, nullptr, false);
  EXPECT_EQ(j["error"]["code"], "unsupported_media_type") << r->body;
  EXPECT_NE(r->body.find("application/json"), std::string::npos) << r->body;
}

TEST_F(RouterFramingTest, MalformedHeadsGet400AndACloseAtOnce) {
  for (const std::string& bytes :
       {std::string("POST /v1/completions HTTP/1.1\nHost: x\nContent-Length: 2\n\n{}"),
        std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11) +
            std::string(4000, '\x7f')}) {
    testing::RawHttpClient raw(router_->port());
    ASSERT_TRUE(raw.ok());
    (void)raw.Send(bytes);
    const TimePoint sent = Clock::now();
    bool closed = false;
    const std::string answer = raw.ReadUntilClose(Deadline::AfterMs(15000), &closed);
    const double took = SecondsSince(sent);
    EXPECT_TRUE(answer.starts_with("HTTP/1.1 400 ")) << answer.substr(0, 200);
    EXPECT_TRUE(closed);
    EXPECT_LT(took, 1.0) << "held open";
  }
}

}  // namespace
}  // namespace pdserve::router
