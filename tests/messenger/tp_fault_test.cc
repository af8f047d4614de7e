// Tensor-parallel rank failures with real processes (docs/architecture.md, "Rank failures"):
// `pdserve serve --tp N` nodes whose `pdserve rank-worker` processes are killed (-9) or stopped
// (SIGSTOP), a node killed under its workers, Ctrl-C on a node's whole process group, SIGTERM,
// a prefill node that loses a rank mid-prefill (its decode node retries on another), and bad
// invocations. Each test checks the node's exit status and error text and that no rank worker
// is left (the workers' pids come from the node's log, and are its children). Two tests hold
// engine/rank_workers.h themselves, with real rank-worker processes, to see what the node's
// own teardown would otherwise hide: the watcher kills a worker that cannot leave 0.5 s after
// the group failed while its owner lives on, and a failed start kills the others as fast.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/clock.h"
#include "common/mutex.h"
#include "disagg_util.h"
#include "engine/rank_workers.h"
#include "kernels/dispatch.h"
#include "model/model_dir.h"
#include "testing/processes.h"
#include "testing/test_models.h"
#include "testing/test_paths.h"

namespace pdserve::testing {
namespace {

// Small steps, so that a prefill or a long decode takes many forward passes and a fault lands
// inside one.
const std::vector<std::string> kNodeFlags = {"--threads",          "1", "--page-size", "4",
                                             "--max-batch-tokens", "16"};

double SecondsSince(TimePoint start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A `pdserve serve --tp N` node with its log in a file, and its rank workers' pids as that log
// names them ("tensor parallel: rank R of N is pid P"). Any worker still alive at destruction
// is killed, so that a test that fails leaves nothing behind either; the log goes too.
class TpNode {
 public:
  TpNode(int tp, const std::vector<std::string>& extra, bool own_process_group = false)
      : log_dir_(MakeTempDir("tp-fault")), log_path_(log_dir_ + "/node.log") {
    std::vector<std::string> args = kNodeFlags;
    args.insert(args.end(), {"--tp", std::to_string(tp)});
    args.insert(args.end(), extra.begin(), extra.end());
    NodeLaunch launch;
    launch.log_path = log_path_;
    launch.own_process_group = own_process_group;
    node_ = std::make_unique<NodeProcess>(TinyModelDir(), args, launch);
    if (!node_->ok()) {
      error_ = node_->error() + "\nlog:\n" + Log();
      return;
    }
    const std::string log = Log();
    const std::regex started(R"(tensor parallel: rank (\d+) of \d+ is pid (\d+))");
    for (std::sregex_iterator m(log.begin(), log.end(), started), end; m != end; ++m) {
      workers_[std::stoi((*m)[1])] = static_cast<pid_t>(std::stoi((*m)[2]));
    }
    // Each is the node's child and runs rank-worker.
    const std::vector<pid_t> children = ChildrenOf(node_->pid());
    for (const auto& [rank, pid] : workers_) {
      if (std::find(children.begin(), children.end(), pid) == children.end() ||
          ProcFile(pid, "cmdline").find("rank-worker") == std::string::npos) {
        error_ = "rank " + std::to_string(rank) + " (pid " + std::to_string(pid) +
                 ") is not a rank-worker child of the node";
      }
    }
    if (static_cast<int>(workers_.size()) != tp - 1 || children.size() != workers_.size()) {
      error_ = "expected " + std::to_string(tp - 1) + " rank workers; the log names " +
               std::to_string(workers_.size()) + ", the node has " +
               std::to_string(children.size()) + " children\nlog:\n" + log;
    }
  }
  ~TpNode() {
    for (pid_t pid : workers()) {
      if (ProcessAlive(pid) && ProcFile(pid, "cmdline").find("rank-worker") != std::string::npos) {
        kill(pid, SIGKILL);
      }
    }
    node_.reset();
    std::error_code ec;
    std::filesystem::remove_all(log_dir_, ec);
  }
  TpNode(const TpNode&) = delete;
  TpNode& operator=(const TpNode&) = delete;

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  NodeProcess& node() { return *node_; }
  int port() const { return node_->port(); }
  pid_t worker(int rank) const {
    auto it = workers_.find(rank);
    return it == workers_.end() ? -1 : it->second;
  }
  std::vector<pid_t> workers() const {
    std::vector<pid_t> pids;
    for (const auto& [rank, pid] : workers_) pids.push_back(pid);
    return pids;
  }
  std::string Log() const { return ReadFile(log_path_); }

 private:
  const std::string log_dir_;
  const std::string log_path_;
  std::unique_ptr<NodeProcess> node_;
  std::map<int, pid_t> workers_;
  std::string error_;
};

std::string Pid(pid_t pid) { return std::to_string(pid); }

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// (a) A rank worker killed with -9 during a request: the request fails with an error naming
// the rank, the node stops with exit 1, naming it too, and the other worker leaves as well.
TEST(TpFaultTest, KilledRankWorkerStopsTheNodeNamingTheRank) {
  TpNode n(3, {});
  ASSERT_TRUE(n.ok()) << n.error();
  const Completion served = Complete(n.port(), RandomPrompt(9, 1), 4);
  ASSERT_EQ(served.status, 200) << served.body.dump();
  auto pending =
      std::async(std::launch::async, [&] { return Complete(n.port(), RandomPrompt(8, 5), 3000); });
  ASSERT_EQ(WaitForMetric(n.port(), "pdserve:num_requests_running", 1, 10000), 1);
  const pid_t victim = n.worker(2);
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  const Completion failed = pending.get();
  EXPECT_EQ(failed.status, 503) << failed.body.dump();
  EXPECT_EQ(failed.body["error"]["code"], "service_unavailable") << failed.body.dump();
  EXPECT_TRUE(Contains(ErrorMessage(failed), "rank 2 (pid " + Pid(victim) + ") killed by signal 9"))
      << ErrorMessage(failed);
  EXPECT_EQ(n.node().Wait(15000), 1) << n.Log();
  const std::string log = n.Log();
  EXPECT_TRUE(Contains(log, "tensor-parallel group failed: rank 2 (pid " + Pid(victim) +
                                ") killed by signal 9: the node stops"))
      << log;
  EXPECT_TRUE(WaitAllGone(n.workers(), Deadline::AfterMs(5000)));
}

// (b) The node killed with -9: its workers die with it (PR_SET_PDEATHSIG); nothing else would
// end them, since an idle worker waits for its next step without a deadline.
TEST(TpFaultTest, KilledNodeTakesItsRankWorkersAlong) {
  TpNode n(2, {});
  ASSERT_TRUE(n.ok()) << n.error();
  ASSERT_TRUE(ProcessAlive(n.worker(1)));
  ASSERT_TRUE(n.node().Signal(SIGKILL).ok());
  EXPECT_EQ(n.node().Wait(10000), 128 + SIGKILL);
  EXPECT_TRUE(WaitAllGone(n.workers(), Deadline::AfterMs(5000)))
      << "a rank worker outlived its node";
}

// (c) A rank worker stopped (SIGSTOP) during a request: the leader gives up at --tp-timeout-s,
// the request fails with an error naming the stopped rank, the node stops at once, and the
// stopped worker (which cannot leave by itself) is killed after the short grace.
TEST(TpFaultTest, StoppedRankWorkerFailsTheRequestAtTheTimeoutAndStopsTheNode) {
  TpNode n(2, {"--tp-timeout-s", "2"});
  ASSERT_TRUE(n.ok()) << n.error();
  auto pending =
      std::async(std::launch::async, [&] { return Complete(n.port(), RandomPrompt(8, 2), 3000); });
  ASSERT_EQ(WaitForMetric(n.port(), "pdserve:num_requests_running", 1, 10000), 1);
  const pid_t victim = n.worker(1);
  ASSERT_EQ(kill(victim, SIGSTOP), 0);
  const TimePoint stopped = Clock::now();
  const Completion failed = pending.get();
  const double failed_after = SecondsSince(stopped);
  EXPECT_EQ(failed.status, 504) << failed.body.dump();
  EXPECT_TRUE(Contains(ErrorMessage(failed),
                       "timed out after 2.0 s in a collective, waiting for "
                       "rank 1 (pid " +
                           Pid(victim) + ")"))
      << ErrorMessage(failed);
  EXPECT_GE(failed_after, 1.5);
  EXPECT_LT(failed_after, 10.0);
  // 0.5 s of grace for the stopped worker, then the node's own shutdown: well under the 5 s an
  // orderly shutdown would grant it (a TSan build tears down slower).
  const TimePoint responded = Clock::now();
  EXPECT_EQ(n.node().Wait(10000), 1) << n.Log();
  EXPECT_LT(SecondsSince(responded), kThreadSanitizer ? 4.5 : 3.0) << n.Log();
  const std::string log = n.Log();
  // The first failure is reported, not its consequence (the worker killed afterwards).
  EXPECT_TRUE(std::regex_search(log, std::regex("group failed: rank 0 \\(pid \\d+\\) timed out "
                                                "[^\n]*rank 1 \\(pid " +
                                                Pid(victim) + "\\): the node stops")))
      << log;
  EXPECT_TRUE(Contains(log, "rank 1 (pid " + Pid(victim) +
                                ") still running 0.5 s after the group failed: killing it"))
      << log;
  EXPECT_TRUE(WaitAllGone(n.workers(), Deadline::AfterMs(2000)));
}

// (d) 1 D + 2 P, both P with --tp 2: the rank worker of the P that runs a long prompt's prefill
// is killed mid-prefill. That P stops (exit 1); D retries on the other P and returns the tokens
// of a colocated node.
TEST(TpFaultTest, PrefillNodeLosingARankIsRetriedOnTheOther) {
  const std::vector<std::string> messenger = {"--heartbeat-ms", "100", "--peer-timeout-ms", "1500"};
  TpNode p1(2, PrefillArgs("tcp", messenger));
  ASSERT_TRUE(p1.ok()) << p1.error();
  TpNode p2(2, PrefillArgs("tcp", messenger));
  ASSERT_TRUE(p2.ok()) << p2.error();
  std::vector<std::string> decode_flags = {
      "--threads", "1", "--page-size", "4", "--prefill-timeout-ms", "60000"};
  decode_flags.insert(decode_flags.end(), messenger.begin(), messenger.end());
  NodeProcess decode(TinyModelDir(), DecodeArgs("tcp", {p1.port(), p2.port()}, decode_flags));
  ASSERT_TRUE(decode.ok()) << decode.error();
  ASSERT_EQ(WaitForMetric(decode.port(), "pdserve:messenger_peers_ready", 2, 20000), 2);
  NodeProcess colocated(TinyModelDir(), {"--threads", "1", "--page-size", "4"});
  ASSERT_TRUE(colocated.ok()) << colocated.error();

  const std::vector<int32_t> prompt = RandomPrompt(kLongPromptTokens, 31);
  const Completion want = Complete(colocated.port(), prompt, 4);
  ASSERT_EQ(want.status, 200) << want.body.dump();
  auto pending = std::async(std::launch::async, [&] { return Complete(decode.port(), prompt, 4); });
  TpNode* victim = nullptr;
  TpNode* survivor = nullptr;
  for (const Deadline deadline = Deadline::AfterMs(10000); victim == nullptr;) {
    if (NodeMetric(p1.port(), "pdserve:messenger_requests_in_flight") == 1) {
      victim = &p1, survivor = &p2;
    } else if (NodeMetric(p2.port(), "pdserve:messenger_requests_in_flight") == 1) {
      victim = &p2, survivor = &p1;
    } else if (deadline.Passed()) {
      break;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ASSERT_NE(victim, nullptr) << "no prefill node took the request";
  const pid_t rank1 = victim->worker(1);
  ASSERT_EQ(kill(rank1, SIGKILL), 0);
  const Completion got = pending.get();
  ASSERT_EQ(got.status, 200) << got.body.dump() << "\nvictim's log:\n" << victim->Log();
  EXPECT_EQ(got.token_ids, want.token_ids);
  EXPECT_EQ(NodeMetric(decode.port(), "pdserve:messenger_requests_retried_total"), 1);
  EXPECT_EQ(victim->node().Wait(15000), 1) << victim->Log();
  EXPECT_TRUE(Contains(victim->Log(), "group failed: rank 1 (pid " + Pid(rank1) +
                                          ") killed by signal 9: the node stops"))
      << victim->Log();
  EXPECT_TRUE(WaitAllGone(victim->workers(), Deadline::AfterMs(5000)));
  ExpectNodeDrained(decode.port());
  ExpectNodeDrained(survivor->port());
}

// (e) Bad invocations end at once with a clear error and a nonzero status.
TEST(TpFaultTest, BadInvocationsAreClearErrors) {
  const std::string pdserve = BinaryPath("src/cli/pdserve");
  const std::string model = TinyModelDir();
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"serve", "--model", model, "--tp", "0"}, "--tp: Value 0 not in range 1 to 64"},
      {{"generate", "--model", model, "--tp", "0", "--prompt", "x"}, "--tp: Value 0 not in range"},
      {{"serve", "--model", model, "--tp", "2", "--tp-timeout-s", "0"},
       "--tp-timeout-s: Value 0 not in range 1 to 3600"},
      {{"generate", "--model", model, "--tp", "2", "--tp-timeout-s", "-1", "--prompt", "x"},
       "--tp-timeout-s: Value -1 not in range"},
      {{"serve", "--model", model, "--tp", "2", "--tp-timeout-s", "99999999999"},
       "--tp-timeout-s: Value 99999999999 not in range"},
      // tiny: 8 query heads on 4 KV heads; 16 ranks would split 2 query heads 4 ways.
      {{"generate", "--model", model, "--tp", "16", "--prompt", "x"},
       "TP 16: the 2 query heads of a KV head cannot be split between its 4 replica ranks"},
      {{"serve", "--model", model, "--listen", "127.0.0.1:0", "--tp", "16"},
       "TP 16: the 2 query heads of a KV head cannot be split"},
      // rank-worker is started by its node with inherited fds; by hand it has none.
      {{"rank-worker", "--model", model, "--tp", "2", "--tp-rank", "1"}, "--group-fd is required"},
      {{"rank-worker", "--model", model, "--tp", "2", "--tp-rank", "1", "--group-fd", "0",
        "--kv-fd", "0"},
       "not by hand) --group-fd: fd 0 is not a memfd"},
      // The group is checked before the model is read.
      {{"rank-worker", "--model", "/nonexistent-model", "--tp", "2", "--tp-rank", "1", "--group-fd",
        "0", "--kv-fd", "0"},
       "--group-fd: fd 0 is not a memfd"},
      {{"rank-worker", "--model", model, "--tp", "2", "--tp-rank", "1", "--group-fd", "77",
        "--kv-fd", "78"},
       "fd 77 is not a memfd: Bad file descriptor"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {pdserve};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    const TimePoint start = Clock::now();
    const CommandRun run = RunToCompletion(argv, Deadline::AfterMs(30000));
    const std::string what = c.args[0] + " " + c.args.back();
    ASSERT_TRUE(run.finished) << what << " did not end: " << run.output;
    EXPECT_FALSE(run.exit.success()) << what << ": " << run.output;
    EXPECT_TRUE(run.exit.exited()) << what << ": " << run.exit.ToString();
    EXPECT_TRUE(Contains(run.output, c.says)) << what << ": " << run.output;
    EXPECT_LT(SecondsSince(start), 10.0) << what;
  }
}

// (f) Ctrl-C on a terminal signals the node's whole process group: the workers ignore it, the
// node drains (the running request completes), then shuts its workers down in order and exits 0.
TEST(TpFaultTest, CtrlCOnTheProcessGroupDrainsThenStopsTheWorkers) {
  TpNode n(2, {}, /*own_process_group=*/true);
  ASSERT_TRUE(n.ok()) << n.error();
  auto pending =
      std::async(std::launch::async, [&] { return Complete(n.port(), RandomPrompt(8, 3), 300); });
  ASSERT_EQ(WaitForMetric(n.port(), "pdserve:num_requests_running", 1, 10000), 1);
  ASSERT_TRUE(n.node().Signal(SIGINT, /*group=*/true).ok());
  const Completion done = pending.get();
  EXPECT_EQ(done.status, 200) << done.body.dump();
  EXPECT_EQ(done.token_ids.size(), 300u);
  EXPECT_EQ(n.node().Wait(30000), 0) << n.Log();
  EXPECT_TRUE(WaitAllGone(n.workers(), Deadline::AfterMs(2000)));
  const std::string log = n.Log();
  EXPECT_FALSE(Contains(log, "the node stops")) << log;
  EXPECT_FALSE(Contains(log, "killing it")) << log;  // each worker left by itself
}

// (f) SIGTERM to the node alone: a graceful exit (0) with its workers gone.
TEST(TpFaultTest, SigtermStopsTheNodeAndItsWorkers) {
  TpNode n(2, {});
  ASSERT_TRUE(n.ok()) << n.error();
  const Completion served = Complete(n.port(), RandomPrompt(5, 4), 3);
  ASSERT_EQ(served.status, 200) << served.body.dump();
  const TimePoint start = Clock::now();
  EXPECT_EQ(n.node().Terminate(30000), 0) << n.Log();
  EXPECT_LT(SecondsSince(start), 5.0);
  EXPECT_TRUE(WaitAllGone(n.workers(), Deadline::AfterMs(2000)));
  EXPECT_FALSE(Contains(n.Log(), "killing it")) << n.Log();
}

// The leader's side of TP 2 over the tiny model in this process, with `worker_argv` for rank 1
// (default: the real `pdserve rank-worker`) and a collective timeout of 1 s. Records the
// watcher's report.
class Leader {
 public:
  Leader() {
    ModelDirOptions options;
    options.load_tokenizer = false;
    options.transformer.threads = 1;
    options.transformer.tp_size = 2;
    auto dir = LoadModelDir(TinyModelDir(), options);
    if (!dir.ok()) {
      ADD_FAILURE() << dir.status().ToString();
      return;
    }
    model_ = std::move(dir->transformer);
    // Each of the tiny model's two ranks holds two of its four KV heads: rank 0's layout is
    // rank 1's too.
    auto cache = KvCache::Create(model_->MakeKvLayout(64, 4));
    if (!cache.ok()) {
      ADD_FAILURE() << cache.status().ToString();
      return;
    }
    cache_ = std::move(*cache);
  }

  // The real worker's command line, as `serve --tp 2 --tp-timeout-s 1` builds it.
  static std::vector<std::string> WorkerArgv(const std::string& model, int rank, int group_fd,
                                             int kv_fd) {
    return {BinaryPath("src/cli/pdserve"),
            "rank-worker",
            "--model",
            model,
            "--threads",
            "1",
            "--page-size",
            "4",
            "--tp",
            "2",
            "--tp-timeout-s",
            "1",
            "--tp-rank",
            std::to_string(rank),
            "--group-fd",
            std::to_string(group_fd),
            "--kv-fd",
            std::to_string(kv_fd)};
  }

  Result<std::unique_ptr<RankWorkers>> Start(
      std::function<std::vector<std::string>(int, int, int)> worker_argv, int tp = 2,
      std::vector<KvCache*> caches = {}) {
    if (model_ == nullptr || cache_ == nullptr) return Status::Internal("no model");
    TensorParallelOptions options;
    options.size = tp;
    options.worker_argv = std::move(worker_argv);
    options.worker_env = {{"PDSERVE_KERNELS", std::string(kernels::ActivePath())}};
    options.start_timeout = std::chrono::seconds(60);
    options.collective_timeout = std::chrono::seconds(1);
    options.on_failure = [this](const Status& why) {
      MutexLock lock(&mu_);
      reports_.push_back(why);
    };
    if (caches.empty()) caches = {cache_.get()};
    return RankWorkers::Start(options, caches, model_->Fingerprint());
  }

  std::vector<Status> reports() {
    MutexLock lock(&mu_);
    return reports_;
  }
  KvCache* cache() { return cache_.get(); }

 private:
  std::unique_ptr<Transformer> model_;
  std::unique_ptr<KvCache> cache_;
  Mutex mu_;
  std::vector<Status> reports_ GUARDED_BY(mu_);
};

// A stopped worker cannot leave by itself: the leader times out in a collective, the watcher
// reports that first reason once and kills the worker 0.5 s later, while its owner (a node that
// has not torn down yet) still holds it.
TEST(TpFaultTest, WatcherKillsAStoppedWorkerWhileItsOwnerLivesOn) {
  Leader leader;
  const std::string model = TinyModelDir();
  auto workers = leader.Start([&](int rank, int group_fd, int kv_fd) {
    return Leader::WorkerArgv(model, rank, group_fd, kv_fd);
  });
  ASSERT_TRUE(workers.ok()) << workers.status().ToString();
  const std::vector<pid_t> children = ChildrenOf(getpid());
  ASSERT_EQ(children.size(), 1u);
  const pid_t worker = children[0];
  ASSERT_EQ(kill(worker, SIGSTOP), 0);
  float row[2] = {1, 2};
  const Status gathered = (*workers)->group()->AllGatherColumns(row, 1, 2, 0, 1);
  EXPECT_EQ(gathered.code(), StatusCode::kDeadlineExceeded) << gathered.ToString();
  const TimePoint failed = Clock::now();
  EXPECT_TRUE(WaitAllGone({worker}, Deadline::AfterMs(3000)))
      << "the stopped worker lingers after the group failed";
  EXPECT_LT(SecondsSince(failed), 2.5);
  const std::vector<Status> reports = leader.reports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(reports[0].message(), "rank 0 (pid " + Pid(getpid()) +
                                                 ") timed out after 1.0 s in a collective, "
                                                 "waiting for rank 1 (pid " +
                                                 Pid(worker) + ")"))
      << reports[0].ToString();
}

// A worker that cannot load fails the start at once, naming it, and the workers already
// started are gone within the short grace, not the 5 s of an orderly shutdown. Rank 2 is a
// stand-in that never attaches and ignores nothing: only a kill ends it.
TEST(TpFaultTest, FailedStartNamesTheRankAndKillsTheOthersAtOnce) {
  Leader leader;
  auto rank2_cache = KvCache::Create(KvLayout(leader.cache()->layout()));
  ASSERT_TRUE(rank2_cache.ok());
  const std::string model = TinyModelDir();
  const TimePoint start = Clock::now();
  auto workers = leader.Start(
      [&](int rank, int group_fd, int kv_fd) -> std::vector<std::string> {
        if (rank == 2) return {"/bin/sleep", "60"};
        return Leader::WorkerArgv("/nonexistent-model", rank, group_fd, kv_fd);
      },
      3, {leader.cache(), rank2_cache->get()});
  ASSERT_FALSE(workers.ok());
  EXPECT_TRUE(std::regex_search(workers.status().message(),
                                std::regex(R"(rank 1 \(pid \d+\) exited with 1 while loading)")))
      << workers.status().ToString();
  EXPECT_LT(SecondsSince(start), 4.0);
  EXPECT_TRUE(ChildrenOf(getpid()).empty()) << "a worker outlived the failed start";
  EXPECT_TRUE(leader.reports().empty());  // no watcher yet: the error is Start's
}

}  // namespace
}  // namespace pdserve::testing
