// `pdserve up --prefill 1 --decode 1` as a user runs it: one command starts a router, a prefill
// node and a decode node; a greedy completion through the router returns, token for token, what
// a colocated `serve` returns, with the prompt's KV written by the prefill node (the decode
// node's KV-write counter moves); SIGTERM to `up` stops every node. Flags that mix colocated and
// disaggregated nodes are refused.
#include <sched.h>
#include <signal.h>

#include <optional>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/subprocess.h"
#include "disagg_util.h"
#include "testing/processes.h"
#include "testing/test_models.h"
#include "testing/test_paths.h"

namespace pdserve::testing {
namespace {

struct UpNode {
  std::string role;
  int port = 0;
  pid_t pid = -1;
};

struct RunningUp {
  std::optional<Subprocess> process;
  int router_port = 0;
  std::vector<UpNode> nodes;
  std::string output;  // stdout so far, for failure messages
};

// Starts `pdserve up <args>` and reads its ready line and node lines, up to the curl line.
void StartUp(const std::vector<std::string>& args, RunningUp* up) {
  SubprocessOptions options;
  options.argv = {BinaryPath("src/cli/pdserve"), "up"};
  options.argv.insert(options.argv.end(), args.begin(), args.end());
  options.stdout_mode = StdStream::kPipe;
  options.new_process_group = true;  // the destructor's SIGKILL reaches the nodes too
  auto process = Subprocess::Spawn(options);
  ASSERT_TRUE(process.ok()) << process.status().ToString();
  up->process = std::move(*process);
  const Deadline deadline = Deadline::AfterMs(180000);  // generous: 2 shared cores
  const std::regex ready(R"(ready at http://[^:]+:(\d+))");
  const std::regex node(R"((prefill|decode|colocated) node http://127\.0\.0\.1:(\d+) pid (\d+))");
  for (;;) {
    auto line = up->process->ReadLine(deadline);
    ASSERT_TRUE(line.ok()) << "pdserve up did not get ready: " << line.status().ToString()
                           << "\nstdout:\n"
                           << up->output;
    up->output += *line + "\n";
    std::smatch m;
    if (std::regex_search(*line, m, ready)) up->router_port = std::stoi(m[1]);
    if (std::regex_search(*line, m, node)) {
      up->nodes.push_back({m[1], std::stoi(m[2]), static_cast<pid_t>(std::stoi(m[3]))});
    }
    if (line->rfind("curl ", 0) == 0) break;
  }
  ASSERT_GT(up->router_port, 0) << up->output;
}

// The CPUs a process may run on, from /proc/PID/status ("0-1,4").
std::string CpusAllowed(pid_t pid) {
  const std::string status = ProcFile(pid, "status");
  const std::string key = "Cpus_allowed_list:";
  const size_t at = status.find(key);
  if (at == std::string::npos) return "";
  const size_t end = status.find('\n', at);
  std::string list = status.substr(at + key.size(), end - at - key.size());
  list.erase(0, list.find_first_not_of(" \t"));
  return list;
}

// The nodes' pids.
std::vector<pid_t> PidsOf(const std::vector<UpNode>& nodes) {
  std::vector<pid_t> pids;
  for (const UpNode& n : nodes) pids.push_back(n.pid);
  return pids;
}

TEST(UpDisaggTest, OnePrefillOneDecodeMatchColocatedAndStopOnSigterm) {
  PD_REQUIRE_SHARED("models/stories260K");
  const std::string model = SharedPath("models/stories260K");
  RunningUp up;
  ASSERT_NO_FATAL_FAILURE(StartUp({"--model", model, "--prefill", "1", "--decode", "1", "--port",
                                   "0", "--threads-per-node", "1", "--kv-cache-mb", "64"},
                                  &up));
  ASSERT_EQ(up.nodes.size(), 2u) << up.output;
  EXPECT_EQ(up.nodes[0].role, "prefill");
  EXPECT_EQ(up.nodes[1].role, "decode");
  const int decode_port = up.nodes[1].port;
  // Ready means handshaken: the decode node already has its prefill peer.
  EXPECT_EQ(NodeMetric(decode_port, "pdserve:messenger_peers_ready"), 1);
  // The cluster key reaches the nodes through the environment, never their command line.
  for (const UpNode& n : up.nodes) {
    EXPECT_EQ(ProcFile(n.pid, "cmdline").find("cluster-key"), std::string::npos) << n.role;
    EXPECT_NE(ProcFile(n.pid, "environ").find("PDSERVE_CLUSTER_KEY="), std::string::npos) << n.role;
  }
  // With two cores or more, P and D run on different ones.
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0 && CPU_COUNT(&allowed) >= 2) {
    EXPECT_NE(CpusAllowed(up.nodes[0].pid), CpusAllowed(up.nodes[1].pid));
  }

  NodeProcess colocated(model, {"--threads", "1", "--kv-cache-mb", "64"});
  ASSERT_TRUE(colocated.ok()) << colocated.error();
  // Several KV pages and a short prompt.
  for (int length : {37, 5}) {
    const std::vector<int32_t> prompt = RandomPrompt(length, 11 + static_cast<uint32_t>(length));
    const Completion want = Complete(colocated.port(), prompt, 8);
    const Completion got = Complete(up.router_port, prompt, 8);
    ASSERT_EQ(want.status, 200) << want.body.dump();
    ASSERT_EQ(got.status, 200) << got.body.dump();
    EXPECT_EQ(got.token_ids.size(), 8u);
    EXPECT_EQ(got.token_ids, want.token_ids) << "prompt length " << length;
  }
  // The prompts' KV came from the prefill node, not from a local prefill.
  EXPECT_GT(NodeMetric(decode_port, "pdserve:messenger_kv_writes_received_total"), 0);
  // The router knows only the decode node: the prefill node serves no generation API.
  EXPECT_EQ(Complete(up.nodes[0].port, {5, 6, 7}, 2).status, 404);

  ASSERT_TRUE(up.process->Signal(SIGTERM).ok());
  auto status = up.process->WaitFor(Deadline::AfterMs(60000));
  ASSERT_TRUE(status.ok()) << "pdserve up did not exit after SIGTERM";
  EXPECT_TRUE(status->success()) << status->ToString();
  EXPECT_TRUE(WaitAllGone(PidsOf(up.nodes), Deadline::AfterMs(10000))) << "a node outlived `up`";
}

// The seed models through `up` (Qwen3-MoE; DeepSeek-V3 with MLA's latent cache), one prefill and
// one decode node: the router's answers are the greedy tokens of a colocated node, and the KV
// came over the messenger.
class UpSeedModelTest : public ::testing::TestWithParam<const char*> {};

TEST_P(UpSeedModelTest, ServedDisaggregatedMatchesColocated) {
  const std::string model = SyntheticModelDir(GetParam());
  RunningUp up;
  ASSERT_NO_FATAL_FAILURE(StartUp({"--model", model, "--prefill", "1", "--decode", "1", "--port",
                                   "0", "--threads-per-node", "1", "--kv-cache-mb", "64"},
                                  &up));
  ASSERT_EQ(up.nodes.size(), 2u) << up.output;
  NodeProcess colocated(model, {"--threads", "1", "--kv-cache-mb", "64"});
  ASSERT_TRUE(colocated.ok()) << colocated.error();
  for (int length : {29, 3}) {
    const std::vector<int32_t> prompt = RandomPrompt(length, 5 + static_cast<uint32_t>(length));
    const Completion want = Complete(colocated.port(), prompt, 8);
    const Completion got = Complete(up.router_port, prompt, 8);
    ASSERT_EQ(want.status, 200) << want.body.dump();
    ASSERT_EQ(got.status, 200) << got.body.dump();
    EXPECT_EQ(got.token_ids, want.token_ids) << "prompt length " << length;
  }
  EXPECT_GT(NodeMetric(up.nodes[1].port, "pdserve:messenger_kv_writes_received_total"), 0);
  ASSERT_TRUE(up.process->Signal(SIGTERM).ok());
  auto status = up.process->WaitFor(Deadline::AfterMs(60000));
  ASSERT_TRUE(status.ok()) << "pdserve up did not exit after SIGTERM";
  EXPECT_TRUE(status->success()) << status->ToString();
}

INSTANTIATE_TEST_SUITE_P(Presets, UpSeedModelTest,
                         ::testing::Values("qwen3-moe-tiny", "deepseek-v3-tiny"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string name = info.param;
                           for (char& ch : name) {
                             if (ch == '-') ch = '_';
                           }
                           return name;
                         });

TEST(UpDisaggTest, MixingColocatedAndDisaggregatedFlagsIsRefused) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"up", "--nodes", "2", "--prefill", "1", "--decode", "1"},
        std::vector<std::string>{"up", "--prefill", "1"},
        std::vector<std::string>{"up", "--nodes", "1", "--fabric-provider", "shm"}}) {
    int exit_code = 0;
    RunPdserve(args, &exit_code);
    EXPECT_NE(exit_code, 0) << "accepted: pdserve " << ::testing::PrintToString(args);
    EXPECT_NE(exit_code, -1) << "did not exit: pdserve " << ::testing::PrintToString(args);
  }
}

}  // namespace
}  // namespace pdserve::testing
