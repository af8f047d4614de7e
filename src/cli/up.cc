// `pdserve up`: a whole local cluster in one command — the router (in this process) and N
// colocated nodes (child processes running `pdserve serve`), each pinned to its own cores.
// Prints the URL and a ready curl line once every node is healthy; Ctrl-C/SIGTERM drains and
// stops all, nodes first, router last.
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "cli/model_flags.h"
#include "cli/router_process.h"
#include "cli/up_processes.h"
#include "common/logging.h"
#include "http/cluster_auth.h"
#include "model/synthetic.h"
#include "router/router.h"

namespace pdserve::cli {
namespace {

namespace fs = std::filesystem;

struct UpFlags {
  std::string model;  // empty: the embedded default ("tiny"), built once into the cache
  int nodes = 0;      // 0: 2 when there are at least 2 cores, else 1
  std::string host = "127.0.0.1";
  int port = 8000;
  int threads_per_node = 0;  // 0: the node's share of the cores
  std::string api_key;
  int kv_cache_mb = 256;
  int startup_timeout_s = 300;
  int stop_timeout_s = 10;
  int shutdown_grace_s = 30;
};

// $XDG_CACHE_HOME/pdserve/tiny, else ~/.cache/pdserve/tiny; written on first use.
Result<std::string> DefaultModelDir() {
  fs::path cache;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    cache = xdg;
  } else if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    cache = fs::path(home) / ".cache";
  } else {
    return Status::FailedPrecondition("neither XDG_CACHE_HOME nor HOME is set; pass --model");
  }
  const fs::path dir = cache / "pdserve" / "tiny";
  if (fs::exists(dir / "config.json")) return dir.string();
  // Written beside the final place and renamed, so a crash never leaves half a model there.
  const fs::path tmp = cache / "pdserve" / ("tiny.tmp-" + std::to_string(getpid()));
  std::error_code ec;
  fs::create_directories(tmp, ec);
  if (ec) return Status::IoError("cannot create " + tmp.string() + ": " + ec.message());
  PD_LOG_INFO("up: writing the default model (synthetic 'tiny') to {}", dir.string());
  if (Status s = WriteSyntheticModel("tiny", tmp.string(), /*seed=*/0); !s.ok()) {
    fs::remove_all(tmp, ec);
    return s;
  }
  fs::rename(tmp, dir, ec);
  if (ec && !fs::exists(dir / "config.json")) {
    return Status::IoError("cannot rename " + tmp.string() + " to " + dir.string());
  }
  fs::remove_all(tmp, ec);  // left over if another `up` won the race
  return dir.string();
}

// 32 random bytes from the kernel as hex: the cluster secret when none is given.
Result<std::string> RandomSecret() {
  uint8_t bytes[32];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno != EINTR) return Status::FromErrno("getrandom", errno);
    if (n > 0) got += static_cast<size_t>(n);
  }
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  for (uint8_t b : bytes) {
    hex += kDigits[b >> 4];
    hex += kDigits[b & 15];
  }
  return hex;
}

// What every node of this cluster gets in its environment: the API key (so a node's own
// port asks for it as the router does) and the cluster secret (internal endpoints, the KV
// messenger). Never in argv, which every local user can read.
std::vector<std::pair<std::string, std::string>> NodeEnv(const std::string& api_key,
                                                         const std::string& cluster_key) {
  std::vector<std::pair<std::string, std::string>> env = {{http::kClusterKeyEnv, cluster_key}};
  if (!api_key.empty()) env.emplace_back(kApiKeyEnv, api_key);
  return env;
}

Result<std::string> SelfExe() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return Status::IoError("cannot read /proc/self/exe: " + ec.message());
  return exe.string();
}

// The processes to start. --prefill/--decode (messenger issue) will add specs with those roles.
Result<std::vector<NodeSpec>> PlanNodes(const UpFlags& f, CorePlan* plan) {
  const std::vector<int> cpus = AllowedCpus();
  const int nodes = f.nodes > 0 ? f.nodes : (cpus.size() >= 2 ? 2 : 1);
  *plan = PlanCores(cpus, nodes);
  std::vector<NodeSpec> specs(static_cast<size_t>(nodes));
  for (size_t i = 0; i < specs.size(); ++i) {
    specs[i].cpus = plan->node_cpus[i];
    specs[i].threads = f.threads_per_node > 0
                           ? f.threads_per_node
                           : std::max<int>(1, static_cast<int>(specs[i].cpus.size()));
    PD_ASSIGN_OR_RETURN(specs[i].port, FindFreePort());
  }
  return specs;
}

std::vector<std::string> NodeArgv(const std::string& exe, const std::string& model,
                                  const NodeSpec& spec, const UpFlags& f) {
  return {exe,
          "serve",
          "--role",
          spec.role,
          "--model",
          model,
          "--listen",
          "127.0.0.1:" + std::to_string(spec.port),
          "--threads",
          std::to_string(spec.threads),
          "--kv-cache-mb",
          std::to_string(f.kv_cache_mb),
          "--shutdown-grace-s",
          std::to_string(f.shutdown_grace_s)};
}

std::string CpuList(const std::vector<int>& cpus) {
  std::string out;
  for (int c : cpus) out += (out.empty() ? "" : ",") + std::to_string(c);
  return out.empty() ? "any" : out;
}

// Waits until every node is healthy. Fails if a node exits, a signal arrives or time runs out.
Status WaitUntilHealthy(router::Router& front, int nodes, ChildProcesses& children,
                        TerminationSignals& signals, Deadline deadline) {
  while (front.nodes().HealthyCount() < nodes) {
    if (deadline.Passed()) return Status::DeadlineExceeded("nodes not healthy in time");
    for (const std::string& exited : children.ReapExited()) {
      return Status::Unavailable("a node stopped during startup: " + exited);
    }
    if (int signal = signals.WaitFor(std::chrono::milliseconds(100)); signal != 0) {
      return Status::Cancelled("signal " + std::to_string(signal) + " during startup");
    }
  }
  return Status::Ok();
}

void PrintReady(const UpFlags& f, int port, size_t nodes) {
  const std::string url = "http://" + f.host + ":" + std::to_string(port);
  std::string auth;
  if (!f.api_key.empty()) {
    auth = " -H 'Authorization: Bearer " + f.api_key + "'";
  } else if (!ApiKeyFromFlagOrEnv("").empty()) {
    auth = " -H \"Authorization: Bearer $" + std::string(kApiKeyEnv) + "\"";
  }
  std::printf("pdserve up: ready at %s (%zu node%s)\n", url.c_str(), nodes, nodes == 1 ? "" : "s");
  std::printf(
      "curl %s/v1/completions -H 'Content-Type: application/json'%s -d '{\"prompt\": \"Once "
      "upon a time\", \"max_tokens\": 32}'\n",
      url.c_str(), auth.c_str());
  std::fflush(stdout);
}

int RunUp(const UpFlags& f) {
  // Before any thread or child exists: the signals then reach only WaitFor below.
  TerminationSignals signals;
  std::string model = f.model;
  if (model.empty()) {
    PD_ASSIGN_OR_RETURN_CLI(model, DefaultModelDir());
  }
  PD_ASSIGN_OR_RETURN_CLI(std::string exe, SelfExe());
  CorePlan plan;
  PD_ASSIGN_OR_RETURN_CLI(std::vector<NodeSpec> specs, PlanNodes(f, &plan));

  ChildProcesses children;  // its destructor stops any child still running
  router::RouterOptions options;
  options.host = f.host;
  options.port = f.port;
  options.api_key = ApiKeyFromFlagOrEnv(f.api_key);
  options.cluster_key = http::ClusterKeyFromFlagOrEnv("");
  if (options.cluster_key.empty()) {
    PD_ASSIGN_OR_RETURN_CLI(options.cluster_key, RandomSecret());
  }
  const auto env = NodeEnv(options.api_key, options.cluster_key);
  for (const NodeSpec& spec : specs) {
    PD_ASSIGN_OR_RETURN_CLI(pid_t pid,
                            children.Spawn(NodeArgv(exe, model, spec, f), spec.cpus, env));
    PD_LOG_INFO("up: node pid {} role {} on 127.0.0.1:{} cpus {} threads {}", pid, spec.role,
                spec.port, CpuList(spec.cpus), spec.threads);
    options.nodes.push_back("http://127.0.0.1:" + std::to_string(spec.port));
  }
  // The router's threads inherit this pinning; children were pinned in Spawn.
  if (Status s = PinCurrentThread(plan.router_cpus); !s.ok()) PD_LOG_WARN("up: {}", s.ToString());
  PD_ASSIGN_OR_RETURN_CLI(auto front, router::Router::Create(options));
  if (Status s = front->Start(); !s.ok()) return Fail(s.ToString());
  Status ready = WaitUntilHealthy(*front, static_cast<int>(specs.size()), children, signals,
                                  Deadline::After(std::chrono::seconds(f.startup_timeout_s)));
  int exit_code = 0;
  if (ready.ok()) {
    PrintReady(f, front->port(), specs.size());
    while (signals.WaitFor(std::chrono::milliseconds(500)) == 0) {
      for (const std::string& exited : children.ReapExited()) {
        PD_LOG_WARN("up: node {}; the router sends its traffic elsewhere", exited);
      }
    }
    PD_LOG_INFO("up: stopping");
  } else if (ready.code() != StatusCode::kCancelled) {
    exit_code = Fail(ready.ToString());
  }
  // Nodes first, router last: the router refuses new requests but keeps relaying while each
  // node lets its requests finish (or ends them with an error event) and exits.
  front->BeginDrain();
  children.StopAll(Deadline::After(std::chrono::seconds(f.shutdown_grace_s + f.stop_timeout_s)));
  front->FinishDrain(Deadline::AfterMs(2000));
  front->Stop();
  return exit_code;
}

}  // namespace

void AddUpCommand(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<UpFlags>();
  CLI::App* cmd = app.add_subcommand(
      "up", "Start a local cluster (router + nodes) with the default model; Ctrl-C stops it");
  cmd->add_option("--model", flags->model, "Model directory (default: the embedded tiny model)");
  cmd->add_option("--nodes", flags->nodes, "Colocated nodes (0: 2 if there are 2+ cores)")
      ->check(CLI::Range(0, 256));
  cmd->add_option("--host", flags->host, "Router address")->capture_default_str();
  cmd->add_option("--port", flags->port, "Router port (0: any free port)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option("--threads-per-node", flags->threads_per_node,
                  "Compute threads per node (0: its share of the cores)")
      ->check(CLI::Range(0, 1024));
  cmd->add_option("--api-key", flags->api_key,
                  "Require Authorization: Bearer KEY at the router and every node (default: env "
                  "PDSERVE_API_KEY)");
  cmd->add_option("--kv-cache-mb", flags->kv_cache_mb, "KV cache per node in MiB")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--startup-timeout", flags->startup_timeout_s, "Seconds to wait for nodes")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  cmd->add_option("--shutdown-grace-s", flags->shutdown_grace_s,
                  "On SIGTERM/SIGINT: seconds running requests may take to finish before they "
                  "are ended with an error (new ones get 503 at once)")
      ->check(CLI::Range(0, 86400))
      ->capture_default_str();
  cmd->add_option("--stop-timeout", flags->stop_timeout_s,
                  "Seconds past the grace period before a node still running is killed")
      ->check(CLI::Range(1, 600))
      ->capture_default_str();
  cmd->callback([flags, exit_code] { *exit_code = RunUp(*flags); });
}

}  // namespace pdserve::cli
