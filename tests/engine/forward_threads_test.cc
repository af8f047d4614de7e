// The forward pass runs with its configured OpenMP team size on the thread that runs it. The
// engine's loop thread is not the thread that built the model, and OpenMP's team size is a
// per-thread setting (libgomp: a thread that never set it sees the process default), so a size
// applied only where the model was created would not reach the loop thread.

#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "engine_test_util.h"

namespace pdserve {
namespace {

// On the loop thread, after each layer: the team a parallel region there gets.
class TeamSizeObserver : public StepObserver {
 public:
  void OnStepScheduled(uint64_t, std::span<const AnnouncedChunk>) override {}
  void OnLayerDone(uint64_t, int) override {
    int team = 0;
#pragma omp parallel
    {
#pragma omp single
      team = omp_get_num_threads();
    }
    min_team_.store(std::min(min_team_.load(), team));
    max_team_.store(std::max(max_team_.load(), team));
    layers_.fetch_add(1);
  }
  std::atomic<int> min_team_{1 << 30};
  std::atomic<int> max_team_{0};
  std::atomic<int> layers_{0};
};

// The team size a thread gets when it never set one (OMP_NUM_THREADS, or the cores).
int ProcessDefaultTeam() {
  int team = 0;
  std::thread([&team] { team = omp_get_max_threads(); }).join();
  return team;
}

void ExpectLoopThreadTeam(int threads) {
  testing::FixtureOptions options;
  options.threads = threads;
  testing::EngineFixture fixture(testing::TinyModelDir(), options);
  TeamSizeObserver observer;
  fixture.engine().SetStepObserver(&observer);
  fixture.engine().Start();

  std::atomic<bool> finished{false};
  EngineRequest req;
  req.id = "threads";
  req.prompt = {1, 2, 3, 4, 5, 6, 7, 8};
  req.params.temperature = 0;
  req.params.max_tokens = 4;
  req.params.ignore_eos = true;
  req.on_output = [&finished](const RequestOutput& o) {
    if (o.finished) finished.store(true);
  };
  ASSERT_TRUE(fixture.engine().Submit(std::move(req)).ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!finished.load() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  fixture.engine().Stop();
  ASSERT_TRUE(finished.load()) << "the request did not finish within 60 s";
  ASSERT_GT(observer.layers_.load(), 0) << "no layer was reported";
  EXPECT_EQ(observer.min_team_.load(), threads) << "forward passes on the loop thread";
  EXPECT_EQ(observer.max_team_.load(), threads) << "forward passes on the loop thread";
}

// A size other than the process default, so that the default cannot pass for it.
TEST(ForwardThreadsTest, LoopThreadUsesConfiguredTeamAboveDefault) {
  ExpectLoopThreadTeam(ProcessDefaultTeam() + 1);
}

// `serve --threads 1`: one compute thread even where the default is a team of all cores.
TEST(ForwardThreadsTest, LoopThreadUsesTeamOfOne) { ExpectLoopThreadTeam(1); }

}  // namespace
}  // namespace pdserve
