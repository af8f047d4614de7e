// The kernel dispatch on CPUs this host is not: `pdserve generate` under qemu-x86_64 user-mode
// emulation of a Haswell (AVX2, no AVX-512) and of a baseline x86-64 (no AVX at all) picks the
// avx2 and the generic path and reproduces a golden continuation of stories260K; forcing avx2
// on the baseline CPU exits with a clear error instead of dying of SIGILL. Guards against
// AVX code leaking out of the ISA files (src/kernels/kernel_table.h). Skipped, loudly, where
// qemu-x86_64 is not installed (scripts/install-deps.sh installs it).
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "testing/test_paths.h"

namespace pdserve {
namespace {

constexpr char kModel[] = "models/stories260K";

struct ShellRun {
  int wait_status = -1;  // as from waitpid
  std::string out, err;
};

// Runs `cmd` through the shell with stderr captured in a temporary file.
ShellRun RunShell(const std::string& cmd) {
  const std::string dir = ::pdserve::testing::MakeTempDir("qemu_golden");
  const std::string err_path = dir + "/stderr";
  ShellRun run;
  FILE* p = popen((cmd + " 2>" + err_path).c_str(), "r");
  if (p == nullptr) return run;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) run.out.append(buf.data(), n);
  run.wait_status = pclose(p);
  std::ifstream in(err_path);
  std::stringstream ss;
  ss << in.rdbuf();
  run.err = ss.str();
  std::filesystem::remove_all(dir);
  return run;
}

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
    PD_REQUIRE_SHARED(kModel);
    std::ifstream in(::pdserve::testing::SharedPath(std::string(kModel) + "/golden.json"));
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

  // `pdserve generate` of the golden prompt under qemu-x86_64 -cpu `cpu`.
  ShellRun Generate(const std::string& cpu, const std::string& env) const {
    return RunShell(env + " OMP_NUM_THREADS=1 qemu-x86_64 -cpu " + cpu + " " +
                    ::pdserve::testing::BinaryPath("src/cli/pdserve") + " generate --model " +
                    ::pdserve::testing::SharedPath(kModel) + " --prompt '" + prompt_ +
                    "' --max-tokens " + std::to_string(want_.size()) + " --ignore-eos --json");
  }

  void ExpectGoldenOn(const std::string& cpu, const std::string& path) const {
    const ShellRun run = Generate(cpu, "");
    ASSERT_TRUE(WIFEXITED(run.wait_status) && WEXITSTATUS(run.wait_status) == 0)
        << "-cpu " << cpu << " wait status " << run.wait_status << "\n"
        << run.err;
    EXPECT_NE(run.err.find("kernels: " + path), std::string::npos)
        << "-cpu " << cpu << " did not select " << path << ":\n"
        << run.err;
    const auto out = nlohmann::json::parse(run.out, nullptr, false);
    ASSERT_TRUE(out.is_object()) << run.out;
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
  const ShellRun run = Generate("qemu64", "PDSERVE_KERNELS=avx2");
  ASSERT_TRUE(WIFEXITED(run.wait_status))
      << "killed by signal " << (WIFSIGNALED(run.wait_status) ? WTERMSIG(run.wait_status) : 0)
      << "\n"
      << run.err;
  EXPECT_NE(WEXITSTATUS(run.wait_status), 0);
  EXPECT_NE(run.err.find("avx2"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("lacks"), std::string::npos) << run.err;
  EXPECT_TRUE(run.out.empty()) << run.out;
}

}  // namespace
}  // namespace pdserve
