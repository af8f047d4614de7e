// The kernel dispatch on CPUs this host is not: `pdserve generate` under qemu-x86_64 user-mode
// emulation of a Haswell (AVX2, no AVX-512) and of a baseline x86-64 (no AVX at all) picks the
// avx2 and the generic path and reproduces a golden continuation of stories260K; forcing avx2
// on the baseline CPU exits with a clear error instead of dying of SIGILL. Guards against
// AVX code leaking out of the ISA files (src/kernels/kernel_table.h). Skipped, loudly, where
// qemu-x86_64 is not installed (scripts/install-deps.sh installs it).
#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "engine_test_util.h"
#include "testing/processes.h"
#include "testing/test_paths.h"

namespace pdserve {
namespace {

bool HaveQemu() { return std::system("command -v qemu-x86_64 >/dev/null 2>&1") == 0; }

class QemuGoldenTest : public ::testing::Test {
 protected:
  void SetUp() override {
#if !defined(__x86_64__)
    GTEST_SKIP() << "QEMU CPU MODELS NOT TESTED: not an x86-64 build";
#endif
#if defined(PDSERVE_SANITIZER)
    // qemu-user backs a sanitized binary's shadow reservation with real memory: one run of
    // the ASan pdserve grew past 21 GiB and drew a global OOM kill.
    GTEST_SKIP() << "QEMU CPU MODELS NOT TESTED: sanitizer build; qemu-x86_64 cannot run a "
                    "sanitized binary (its shadow memory exhausts RAM). The Release suite runs it";
#endif
    if (!HaveQemu()) {
      GTEST_SKIP() << "QEMU NOT INSTALLED: qemu-x86_64 (Debian qemu-user) is needed to run "
                      "pdserve on emulated CPUs; scripts/install-deps.sh installs it";
    }
    PD_REQUIRE_SHARED(testing::kGoldenModel);
    std::ifstream in(
        ::pdserve::testing::SharedPath(std::string(testing::kGoldenModel) + "/golden.json"));
    const nlohmann::json golden = nlohmann::json::parse(in);
    // A case with a prompt, so the tokenizer and a prefill run too.
    for (const auto& c : golden["cases"]) {
      if (!c["prompt"].get<std::string>().empty()) {
        prompt_ = c["prompt"].get<std::string>();
        want_ = c["greedy_ids"].get<std::vector<int32_t>>();
        break;
      }
    }
    ASSERT_FALSE(want_.empty()) << "golden.json has no case with a prompt";
  }

  // `pdserve generate` of the golden prompt under qemu-x86_64 -cpu `cpu`, with `env` set.
  testing::CommandRun Generate(const std::string& cpu,
                               std::vector<std::pair<std::string, std::string>> env = {}) const {
    env.emplace_back("OMP_NUM_THREADS", "1");
    return testing::RunToCompletion(
        {"qemu-x86_64", "-cpu", cpu, ::pdserve::testing::BinaryPath("src/cli/pdserve"), "generate",
         "--model", ::pdserve::testing::SharedPath(testing::kGoldenModel), "--prompt", prompt_,
         "--max-tokens", std::to_string(want_.size()), "--ignore-eos", "--json"},
        Deadline::AfterMs(300'000), {.env = std::move(env), .separate_stderr = true});
  }

  void ExpectGoldenOn(const std::string& cpu, const std::string& path) const {
    const testing::CommandRun run = Generate(cpu);
    ASSERT_TRUE(run.finished && run.exit.success())
        << "-cpu " << cpu << ": " << run.exit.ToString() << "\n"
        << run.errors;
    EXPECT_NE(run.errors.find("kernels: " + path), std::string::npos)
        << "-cpu " << cpu << " did not select " << path << ":\n"
        << run.errors;
    const auto out = nlohmann::json::parse(run.output, nullptr, false);
    ASSERT_TRUE(out.is_object()) << run.output;
    EXPECT_EQ(out["token_ids"].get<std::vector<int32_t>>(), want_) << "-cpu " << cpu;
  }

  std::string prompt_;
  std::vector<int32_t> want_;
};

TEST_F(QemuGoldenTest, HaswellRunsTheAvx2PathAndReproducesTheGoldenTokens) {
  ExpectGoldenOn("Haswell", "avx2");
}

TEST_F(QemuGoldenTest, BaselineCpuRunsTheGenericPathAndReproducesTheGoldenTokens) {
  ExpectGoldenOn("qemu64", "generic");
}

TEST_F(QemuGoldenTest, ForcingAvx2OnABaselineCpuIsAClearErrorNotASignal) {
  const testing::CommandRun run = Generate("qemu64", {{"PDSERVE_KERNELS", "avx2"}});
  ASSERT_TRUE(run.finished && run.exit.exited()) << run.exit.ToString() << "\n" << run.errors;
  EXPECT_NE(run.exit.code, 0);
  EXPECT_NE(run.errors.find("avx2"), std::string::npos) << run.errors;
  EXPECT_NE(run.errors.find("lacks"), std::string::npos) << run.errors;
  EXPECT_TRUE(run.output.empty()) << run.output;
}

}  // namespace
}  // namespace pdserve
