// `pdserve bench soak`: its flags; the soak itself is bench/soak.h.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "bench/soak.h"
#include "cli/commands.h"
#include "cli/model_flags.h"

namespace pdserve::cli {
namespace {

namespace fs = std::filesystem;

struct BenchSoakFlags {
  bench::SoakOptions options;
  double kill_every_s = 5;
  double down_for_s = 0.5;
  double request_timeout_s = 60;
};

int RunBenchSoak(BenchSoakFlags& f) {
  std::error_code ec;
  f.options.pdserve = fs::read_symlink("/proc/self/exe", ec).string();
  if (ec) return Fail("cannot read /proc/self/exe: " + ec.message());
  auto seconds = [](double s) {
    return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s));
  };
  f.options.kill_every = seconds(f.kill_every_s);
  f.options.down_for = seconds(f.down_for_s);
  f.options.request_timeout = seconds(f.request_timeout_s);
  if (f.options.log_dir.empty()) {
    f.options.log_dir = (fs::temp_directory_path() / "pdserve-soak").string();
  }
  fs::create_directories(f.options.log_dir, ec);
  if (ec) return Fail("cannot create " + f.options.log_dir + ": " + ec.message());
  std::printf("bench soak: %.0f s, logs of the router and nodes in %s\n", f.options.seconds,
              f.options.log_dir.c_str());
  std::fflush(stdout);
  PD_ASSIGN_OR_RETURN_CLI(bench::SoakReport report, bench::RunSoak(f.options));
  std::printf("%s", bench::FormatSoakReport(report).c_str());
  std::fflush(stdout);
  return report.passed() ? 0 : 1;
}

}  // namespace

void AddBenchSoakCommand(CLI::App& bench, int* exit_code) {
  auto flags = std::make_shared<BenchSoakFlags>();
  CLI::App* cmd = bench.add_subcommand(
      "soak", "Router + 2 nodes under streamed load while node B is SIGKILLed and restarted");
  cmd->add_option("--model", flags->options.model_dir, "Model directory of the nodes")->required();
  cmd->add_option("--seconds", flags->options.seconds, "How long the load runs")
      ->check(CLI::Range(1.0, 86400.0))
      ->capture_default_str();
  cmd->add_option("--concurrency", flags->options.concurrency, "Streams in flight")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->add_option("--kill-every", flags->kill_every_s,
                  "Seconds between node B being healthy and its next SIGKILL")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  cmd->add_option("--down-for", flags->down_for_s, "Seconds node B stays dead")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  cmd->add_option("--max-tokens", flags->options.max_tokens, "Each request asks for 1..N tokens")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_option("--node-threads", flags->options.node_threads, "Compute threads per node")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_option("--request-timeout", flags->request_timeout_s,
                  "Seconds per request (a request past it is a violation)")
      ->check(CLI::Range(1.0, 3600.0))
      ->capture_default_str();
  cmd->add_option("--log-dir", flags->options.log_dir,
                  "Where the router's and nodes' logs go (default: $TMPDIR/pdserve-soak)");
  cmd->add_option("--seed", flags->options.seed, "Seed of the prompts and lengths")
      ->capture_default_str();
  cmd->callback([flags, exit_code] { *exit_code = RunBenchSoak(*flags); });
}

}  // namespace pdserve::cli
