// `pdserve up`: a whole local cluster in one command — the router (in this process) and its
// nodes (child processes running `pdserve serve`), each pinned to its own cores: N prefill and
// M decode nodes (--prefill/--decode; 1P1D by default), or K colocated ones (--nodes). The
// router sends requests only to decode (or colocated) nodes; each decode node is given every
// prefill node as a peer. All share a fresh cluster secret (messenger handshake, /internal/
// endpoints) and the API key, passed through the environment. Prints the URL and a ready
// curl line once every node is healthy and every decode node has handshaken with its prefill
// peers; Ctrl-C/SIGTERM drains and stops all, nodes first, router last.
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "cli/http_flags.h"
#include "cli/model_flags.h"
#include "cli/router_process.h"
#include "cli/termination_signals.h"
#include "cli/up_processes.h"
#include "common/logging.h"
#include "common/random_bytes.h"
#include "fabric/descriptors.h"
#include "http/cluster_auth.h"
#include "http/node_client.h"
#include "model/synthetic.h"
#include "router/router.h"

namespace pdserve::cli {
namespace {

namespace fs = std::filesystem;

struct UpFlags {
  std::string model;  // empty: the embedded default ("tiny"), built once into the cache
  // Colocated nodes: -1 not asked for; 0: 2 when there are at least 2 cores, else 1.
  int nodes = -1;
  // Disaggregated nodes; 1P1D when neither these nor --nodes are given.
  int prefill = 0;
  int decode = 0;
  std::string fabric_provider;        // empty: serve's default
  int local_prefill_max_tokens = -1;  // decode nodes; -1: serve's default
  std::string admission;              // decode nodes; empty: serve's default
  std::string host = "127.0.0.1";
  int port = 8000;
  int threads_per_node = 0;  // 0: the node's share of the cores
  std::string api_key;
  int kv_cache_mb = 256;
  std::string weights = "auto";  // every node's --weights
  std::string lm_head = "auto";  // every node's --lm-head
  bool no_prefix_caching = false;
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

// A fresh random secret (hex) for this cluster when none is given.
Result<std::string> RandomSecret() {
  std::array<uint8_t, 32> bytes;
  PD_RETURN_IF_ERROR(FillRandomBytes(bytes, "a cluster secret"));
  return fabric::HexEncode(
      std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
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

// Checks that the flags describe one kind of cluster and fills in the default (1P1D).
Status ResolveTopology(UpFlags* f) {
  const bool disaggregated = f->prefill > 0 || f->decode > 0;
  if (f->nodes >= 0 && disaggregated) {
    return Status::InvalidArgument(
        "--nodes starts colocated nodes and cannot be combined with --prefill/--decode");
  }
  if (disaggregated && (f->prefill == 0 || f->decode == 0)) {
    return Status::InvalidArgument(
        "a disaggregated cluster needs both --prefill N and --decode M (each at least 1)");
  }
  if (f->nodes >= 0 &&
      (!f->fabric_provider.empty() || f->local_prefill_max_tokens >= 0 || !f->admission.empty())) {
    return Status::InvalidArgument(
        "--fabric-provider, --local-prefill-max-tokens and --admission apply to prefill/decode "
        "nodes, not to colocated --nodes");
  }
  if (f->nodes < 0 && !disaggregated) f->prefill = f->decode = 1;
  return Status::Ok();
}

// The processes to start: prefill nodes first (so that with 2 cores 1P1D puts P on the first
// core and D on the second), each decode node told every prefill node's address.
Result<std::vector<NodeSpec>> PlanNodes(const UpFlags& f, CorePlan* plan) {
  const std::vector<int> cpus = AllowedCpus();
  std::vector<std::string> roles;
  if (f.prefill > 0) {
    roles.assign(static_cast<size_t>(f.prefill), "prefill");
    roles.insert(roles.end(), static_cast<size_t>(f.decode), "decode");
  } else {
    roles.assign(f.nodes > 0 ? static_cast<size_t>(f.nodes) : (cpus.size() >= 2 ? 2 : 1),
                 "colocated");
  }
  *plan = PlanCores(cpus, static_cast<int>(roles.size()));
  std::vector<NodeSpec> specs(roles.size());
  std::vector<std::string> prefill_addresses;
  for (size_t i = 0; i < specs.size(); ++i) {
    specs[i].role = roles[i];
    specs[i].cpus = plan->node_cpus[i];
    specs[i].threads = f.threads_per_node > 0
                           ? f.threads_per_node
                           : std::max<int>(1, static_cast<int>(specs[i].cpus.size()));
    PD_ASSIGN_OR_RETURN(specs[i].port, FindFreePort());
    if (specs[i].role == "prefill") {
      prefill_addresses.push_back("127.0.0.1:" + std::to_string(specs[i].port));
    }
  }
  for (NodeSpec& spec : specs) {
    if (spec.role == "decode") spec.prefill_peers = prefill_addresses;
  }
  return specs;
}

std::vector<std::string> NodeArgv(const std::string& exe, const std::string& model,
                                  const NodeSpec& spec, const UpFlags& f) {
  std::vector<std::string> argv = {exe,
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
                                   "--weights",
                                   f.weights,
                                   "--lm-head",
                                   f.lm_head};
  if (f.no_prefix_caching) argv.push_back("--no-prefix-caching");
  if (spec.role != "colocated" && !f.fabric_provider.empty()) {
    argv.insert(argv.end(), {"--fabric-provider", f.fabric_provider});
  }
  for (const std::string& peer : spec.prefill_peers) {
    argv.insert(argv.end(), {"--prefill-peer", peer});
  }
  if (spec.role == "decode" && f.local_prefill_max_tokens >= 0) {
    argv.insert(argv.end(),
                {"--local-prefill-max-tokens", std::to_string(f.local_prefill_max_tokens)});
  }
  if (spec.role == "decode" && !f.admission.empty()) {
    argv.insert(argv.end(), {"--admission", f.admission});
  }
  argv.insert(argv.end(), {"--shutdown-grace-s", std::to_string(f.shutdown_grace_s)});
  return argv;
}

std::string CpuList(const std::vector<int>& cpus) {
  std::string out;
  for (int c : cpus) out += (out.empty() ? "" : ",") + std::to_string(c);
  return out.empty() ? "any" : out;
}

// Why a node the router does not health-check (prefill) or that needs its peers (decode) is not
// ready yet; empty once it is. A decode node is ready once its /metrics shows every prefill
// peer handshaken (pdserve:messenger_peers_ready).
std::string NotReadyReason(const NodeSpec& spec) {
  const std::string who = spec.role + " node 127.0.0.1:" + std::to_string(spec.port);
  if (spec.role == "prefill") {
    return http::NodeGetOk(http::LocalNode(spec.port), "/health").ok() ? ""
                                                                       : who + " is not healthy";
  }
  if (spec.role != "decode") return "";
  const Result<std::string> metrics = http::NodeGetOk(http::LocalNode(spec.port), "/metrics");
  if (!metrics.ok()) return who + " is not healthy";
  constexpr std::string_view kGauge = "\npdserve:messenger_peers_ready ";
  const size_t at = metrics->find(kGauge);
  const int ready = at == std::string::npos ? 0 : std::atoi(metrics->c_str() + at + kGauge.size());
  if (ready >= static_cast<int>(spec.prefill_peers.size())) return "";
  return who + " has " + std::to_string(ready) + " of " +
         std::to_string(spec.prefill_peers.size()) + " prefill peers handshaken";
}

// Waits until the router sees `serving` healthy nodes and every prefill and decode node is
// ready (NotReadyReason). Fails if a node exits, a signal arrives or time runs out.
Status WaitUntilReady(router::Router& front, int serving, const std::vector<NodeSpec>& specs,
                      ChildProcesses& children, TerminationSignals& signals, Deadline deadline) {
  std::vector<bool> ready(specs.size(), false);
  std::string waiting_for;
  for (;;) {
    waiting_for.clear();
    for (size_t i = 0; i < specs.size(); ++i) {
      if (ready[i]) continue;
      const std::string reason = NotReadyReason(specs[i]);
      ready[i] = reason.empty();
      if (!ready[i] && waiting_for.empty()) waiting_for = reason;
    }
    const int healthy = front.nodes().HealthyCount();
    if (waiting_for.empty() && healthy < serving) {
      waiting_for = std::to_string(healthy) + " of " + std::to_string(serving) +
                    " serving nodes healthy at the router";
    }
    if (waiting_for.empty()) return Status::Ok();
    if (deadline.Passed()) {
      return Status::DeadlineExceeded("nodes not ready in time: " + waiting_for);
    }
    for (const std::string& exited : children.ReapExited()) {
      return Status::Unavailable("a node stopped during startup: " + exited);
    }
    if (int signal = signals.WaitFor(std::chrono::milliseconds(100)); signal != 0) {
      return Status::Cancelled("signal " + std::to_string(signal) + " during startup");
    }
  }
}

// The ready line, one line per node (scripts and tests read its port and pid), the curl line.
void PrintReady(const UpFlags& f, const std::string& model, int port,
                const std::vector<NodeSpec>& specs, const std::vector<pid_t>& pids) {
  const std::string url = "http://" + f.host + ":" + std::to_string(port);
  std::string auth;
  if (!f.api_key.empty()) {
    auth = " -H 'Authorization: Bearer " + f.api_key + "'";
  } else if (!ApiKeyFromFlagOrEnv("").empty()) {
    auth = " -H \"Authorization: Bearer $" + std::string(kApiKeyEnv) + "\"";
  }
  const size_t nodes = specs.size();
  if (f.prefill > 0) {
    std::printf("pdserve up: ready at %s (%d prefill + %d decode nodes)\n", url.c_str(), f.prefill,
                f.decode);
  } else {
    std::printf("pdserve up: ready at %s (%zu node%s)\n", url.c_str(), nodes,
                nodes == 1 ? "" : "s");
  }
  if (f.model.empty()) {
    // A first-time user should not mistake the synthetic model's answers for a broken server.
    std::printf(
        "  model: the embedded synthetic 'tiny' model (random weights: it answers noise; serve a "
        "real one with --model DIR, a Hugging Face directory)\n");
  } else {
    std::printf("  model: %s\n", model.c_str());
  }
  for (size_t i = 0; i < nodes; ++i) {
    std::printf("  %s node http://127.0.0.1:%d pid %d cpus %s\n", specs[i].role.c_str(),
                specs[i].port, static_cast<int>(pids[i]), CpuList(specs[i].cpus).c_str());
  }
  std::printf(
      "curl %s/v1/completions -H 'Content-Type: application/json'%s -d '{\"prompt\": \"Once "
      "upon a time\", \"max_tokens\": 32}'\n",
      url.c_str(), auth.c_str());
  std::fflush(stdout);
}

int RunUp(UpFlags f) {
  if (Status s = ResolveTopology(&f); !s.ok()) return Fail(s.ToString());
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
  std::vector<pid_t> pids;
  for (const NodeSpec& spec : specs) {
    PD_ASSIGN_OR_RETURN_CLI(pid_t pid,
                            children.Spawn(NodeArgv(exe, model, spec, f), spec.cpus, env));
    pids.push_back(pid);
    PD_LOG_INFO("up: node pid {} role {} on 127.0.0.1:{} cpus {} threads {}", pid, spec.role,
                spec.port, CpuList(spec.cpus), spec.threads);
    // Prefill nodes serve no generation API: the router never sees them.
    if (spec.role != "prefill") {
      options.nodes.push_back("http://127.0.0.1:" + std::to_string(spec.port));
    }
  }
  // The router's threads inherit this pinning; children were pinned in Spawn.
  if (Status s = PinCurrentThread(plan.router_cpus); !s.ok()) PD_LOG_WARN("up: {}", s.ToString());
  PD_ASSIGN_OR_RETURN_CLI(auto front, router::Router::Create(options));
  if (Status s = front->Start(); !s.ok()) return Fail(s.ToString());
  Status ready =
      WaitUntilReady(*front, static_cast<int>(options.nodes.size()), specs, children, signals,
                     Deadline::After(std::chrono::seconds(f.startup_timeout_s)));
  int exit_code = 0;
  if (ready.ok()) {
    PrintReady(f, model, front->port(), specs, pids);
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
  cmd->add_option("--prefill", flags->prefill,
                  "Prefill nodes (with --decode; default without --nodes: 1 prefill + 1 decode)")
      ->check(CLI::Range(1, 256));
  cmd->add_option("--decode", flags->decode, "Decode nodes (with --prefill)")
      ->check(CLI::Range(1, 256));
  cmd->add_option("--nodes", flags->nodes,
                  "Colocated nodes instead of prefill/decode ones (0: 2 if there are 2+ cores)")
      ->check(CLI::Range(0, 256));
  cmd->add_option("--fabric-provider", flags->fabric_provider,
                  "KV transfer provider of the prefill/decode nodes: tcp | shm (default: serve's)")
      ->check(CLI::IsMember({"tcp", "shm"}));
  cmd->add_option("--local-prefill-max-tokens", flags->local_prefill_max_tokens,
                  "Decode nodes prefill prompts up to this many tokens themselves (default: "
                  "serve's)")
      ->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--admission", flags->admission,
                  "Decode nodes' admission policy: off | refuse | local (default: serve's)")
      ->check(CLI::IsMember({"off", "refuse", "local"}));
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
  cmd->add_option("--weights", flags->weights,
                  "Every node's linear layers' weights (serve --weights)")
      ->check(CLI::IsMember({"auto", "bf16", "fp8", "int8"}))
      ->capture_default_str();
  cmd->add_option("--lm-head", flags->lm_head, "Every node's output matrix (serve --lm-head)")
      ->check(CLI::IsMember({"auto", "bf16", "int8"}))
      ->capture_default_str();
  cmd->add_flag("--no-prefix-caching", flags->no_prefix_caching,
                "Turn off every node's automatic prefix caching");
  cmd->add_option("--startup-timeout", flags->startup_timeout_s, "Seconds to wait for nodes")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  AddShutdownGraceFlag(cmd, &flags->shutdown_grace_s);
  cmd->add_option("--stop-timeout", flags->stop_timeout_s,
                  "Seconds past the grace period before a node still running is killed")
      ->check(CLI::Range(1, 600))
      ->capture_default_str();
  cmd->callback([flags, exit_code] { *exit_code = RunUp(*flags); });
}

}  // namespace pdserve::cli
