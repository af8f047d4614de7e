// `pdserve serve` and where its requests end (issue 36), over raw sockets. A request answered
// before its body was read (a wrong or missing key, a route that takes no body, ...) whose body
// is itself a request never has that request run: the node reads the body or closes the
// connection, saying so, and the next request on the connection gets its own answer. A body
// the API does not take gets 415, never an internal error; a malformed head gets 400 and a
// close at once, not the header deadline.
#include <chrono>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "testing/node_process.h"
#include "testing/raw_http_client.h"

namespace pdserve::testing {
namespace {

using json = nlohmann::json;

constexpr char kKey[] = "framing-key";
const std::string kAuth = std::string("Authorization: Bearer ") + kKey + "\r\n";
// If run, answered 404 "no route GET /smuggled-request"; the follow-up likewise.
const std::string kSmuggled = "GET /smuggled-request HTTP/1.1\r\nHost: x\r\n" + kAuth + "\r\n";
const std::string kFollowUp = "GET /follow-up-request HTTP/1.1\r\nHost: x\r\n" + kAuth + "\r\n";

class NodeFramingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { node_ = new NodeProcess(TinyModelDir(), {"--api-key", kKey}); }
  static void TearDownTestSuite() {
    delete node_;
    node_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(node_->ok()) << node_->error(); }
  static NodeProcess* node_;
};

NodeProcess* NodeFramingTest::node_ = nullptr;

TEST_F(NodeFramingTest, BodiesOfEarlyAnswersAreNeverParsedAsRequests) {
  const std::string post =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n";
  const std::vector<std::string> problems = SmugglingProblems(
      node_->port(),
      [&] {
        std::vector<EarlyAnswer> cases = CommonEarlyAnswers(kAuth, kSmuggled);
        cases.insert(
            cases.end(),
            {
                {"chat, missing key",
                 WithLength("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n", kSmuggled), 401},
                {"internal route without a cluster secret",
                 WithLength("POST /internal/messenger/join HTTP/1.1\r\nHost: x\r\n", kSmuggled),
                 403},
                {"GET with a body",
                 WithLength("GET /v1/models HTTP/1.1\r\nHost: x\r\n" + kAuth, kSmuggled), 200},
                {"open GET with a chunked body",
                 WithChunks("GET /health HTTP/1.1\r\nHost: x\r\n", kSmuggled), 200},
                {"OPTIONS with a body",
                 WithLength("OPTIONS /v1/models HTTP/1.1\r\nHost: x\r\n" + kAuth, kSmuggled), 0},
                {"DELETE with a body",
                 WithLength("DELETE /v1/models HTTP/1.1\r\nHost: x\r\n" + kAuth, kSmuggled), 0},
                {"two Content-Lengths",
                 post + kAuth + "Content-Length: 0\r\nContent-Length: " +
                     std::to_string(kSmuggled.size()) + "\r\n\r\n" + kSmuggled,
                 400, true},
            });
        return cases;
      }(),
      kFollowUp, "/smuggled-request", "/follow-up-request");
  for (const std::string& p : problems) ADD_FAILURE() << p;
}

// curl -F sends multipart/form-data: before, httplib's multipart reader threw into the route
// and the client read 500 "bad_function_call".
TEST_F(NodeFramingTest, BodiesTheApiDoesNotTakeGet415NamingWhatItTakes) {
  httplib::Client client = node_->Client();
  client.set_read_timeout(60, 0);
  const httplib::Headers auth = {{"Authorization", std::string("Bearer ") + kKey}};
  const std::string form =
      "--b\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\nhello\r\n--b--\r\n";
  for (const std::string path : {"/v1/completions", "/v1/chat/completions"}) {
    for (const std::string type : {"multipart/form-data; boundary=b", "application/xml",
                                   "application/octet-stream", "image/png"}) {
      httplib::Result r = client.Post(path, auth, form, type);
      ASSERT_TRUE(r) << path << " " << type;
      EXPECT_EQ(r->status, 415) << path << " " << type << ": " << r->body;
      const json j = json::parse(r->body, nullptr, false);
      EXPECT_EQ(j["error"]["code"], "unsupported_media_type") << r->body;
      EXPECT_NE(r->body.find("application/json"), std::string::npos) << r->body;
      EXPECT_EQ(r->body.find("bad_function_call"), std::string::npos) << r->body;
    }
  }
  // JSON under the types simple clients send (curl -d, fetch with a string, none) is served.
  const std::string body = json{{"prompt", "Once upon a time"}, {"max_tokens", 2}}.dump();
  for (const std::string type : {"application/json", "application/json; charset=utf-8",
                                 "application/x-www-form-urlencoded", "text/plain", ""}) {
    httplib::Result r = client.Post("/v1/completions", auth, body, type);
    ASSERT_TRUE(r) << type;
    EXPECT_EQ(r->status, 200) << "'" << type << "': " << r->body;
  }
}

// Before, a head with bare-LF line ends, or 64 KiB of garbage, held the connection until the
// header deadline (10 s) with no answer.
TEST_F(NodeFramingTest, MalformedHeadsGet400AndACloseAtOnce) {
  std::mt19937 rng(36);
  std::string binary(64 * 1024, '\0');
  for (char& c : binary) c = static_cast<char>(rng());
  struct Case {
    std::string name, bytes;
    int status;
  };
  const std::vector<Case> cases = {
      {"bare LF", "GET /health HTTP/1.1\nHost: x\n\n", 400},
      {"bare LF after the request line", "GET /health HTTP/1.1\r\nHost: x\n\r\n", 400},
      {"binary garbage", binary, 400},
      {"64 KiB line without an end", std::string(64 * 1024, 'A'), 400},
  };
  for (const Case& c : cases) {
    RawHttpClient raw(node_->port());
    ASSERT_TRUE(raw.ok());
    (void)raw.Send(c.bytes);  // the node may refuse before it has all
    const TimePoint sent = Clock::now();
    bool closed = false;
    const std::string answer = raw.ReadUntilClose(Deadline::AfterMs(15000), &closed);
    const double took = SecondsSince(sent);
    const std::vector<RawResponse> r = ParseResponses(answer);
    ASSERT_EQ(r.size(), 1u) << c.name << ": " << answer.substr(0, 200);
    EXPECT_EQ(r[0].status, c.status) << c.name << ": " << r[0].head;
    EXPECT_TRUE(r[0].closes()) << c.name;
    EXPECT_TRUE(closed) << c.name;
    EXPECT_LT(took, 1.0) << c.name << ": held open";
  }
}

}  // namespace
}  // namespace pdserve::testing
