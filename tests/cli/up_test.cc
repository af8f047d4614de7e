// `pdserve up` as a user runs it: it starts, answers a completion through its router, and
// leaves no process behind after SIGTERM (or after being killed with -9).
#include <signal.h>

#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "testing/cluster_processes.h"
#include "testing/test_paths.h"

namespace pdserve::testing {
namespace {

struct RunningUp {
  std::unique_ptr<Subprocess> process;
  int port = 0;
  std::vector<pid_t> children;
};

// Starts `pdserve up` with two nodes and waits for its "ready at" line.
void StartUp(RunningUp* up) {
  const std::string model = TinyModelDir();
  ASSERT_FALSE(model.empty());
  up->process = std::make_unique<Subprocess>(std::vector<std::string>{
      BinaryPath("src/cli/pdserve"), "up", "--model", model, "--nodes", "2", "--port", "0",
      "--threads-per-node", "1", "--kv-cache-mb", "64"});
  auto line = up->process->ReadLineContaining("ready at", Deadline::AfterMs(120000));
  ASSERT_TRUE(line.has_value()) << "pdserve up did not print its ready line";
  std::smatch m;
  ASSERT_TRUE(std::regex_search(*line, m, std::regex(R"(http://[^:]+:(\d+))"))) << *line;
  up->port = std::stoi(m[1]);
  auto curl = up->process->ReadLineContaining("curl ", Deadline::AfterMs(5000));
  ASSERT_TRUE(curl.has_value());
  EXPECT_NE(curl->find("/v1/completions"), std::string::npos);
  up->children = ChildrenOf(up->process->pid());
  EXPECT_EQ(up->children.size(), 2u) << "one child per node";
}

TEST(UpTest, ServesThroughTheRouterAndStopsEverythingOnSigterm) {
  RunningUp up;
  ASSERT_NO_FATAL_FAILURE(StartUp(&up));
  httplib::Client client("127.0.0.1", up.port);
  client.set_read_timeout(60, 0);
  auto r =
      client.Post("/v1/completions", R"({"prompt": "Hello", "max_tokens": 8})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  auto body = nlohmann::json::parse(r->body, nullptr, false);
  EXPECT_TRUE(body.contains("choices")) << r->body;

  up.process->Signal(SIGTERM);
  std::optional<ExitStatus> status = up.process->Wait(Deadline::AfterMs(30000));
  ASSERT_TRUE(status.has_value()) << "pdserve up did not exit after SIGTERM";
  EXPECT_TRUE(status->success()) << status->ToString();
  EXPECT_TRUE(WaitAllGone(up.children, Deadline::AfterMs(5000)));
}

TEST(UpTest, ChildrenDieWhenUpIsKilled) {
  RunningUp up;
  ASSERT_NO_FATAL_FAILURE(StartUp(&up));
  up.process->Signal(SIGKILL);
  ASSERT_TRUE(up.process->Wait(Deadline::AfterMs(10000)).has_value());
  EXPECT_TRUE(WaitAllGone(up.children, Deadline::AfterMs(10000)))
      << "nodes outlived `up` killed with -9 (PR_SET_PDEATHSIG)";
}

}  // namespace
}  // namespace pdserve::testing
