// `pdserve router`: the OpenAI-compatible front that spreads requests over nodes
// (router/router.h). Runs until SIGINT/SIGTERM.
#include <csignal>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/etcd_flags.h"
#include "cli/http_flags.h"
#include "cli/model_flags.h"
#include "cli/router_process.h"
#include "cli/termination_signals.h"
#include "common/logging.h"
#include "http/cluster_auth.h"
#include "http/etcd_membership.h"
#include "router/router.h"

namespace pdserve::cli {
namespace {

struct RouterFlags {
  std::string listen = "127.0.0.1:8000";
  std::vector<std::string> nodes;
  std::string api_key;
  std::string cluster_key;
  int http_threads = 256;
  int max_attempts = 3;
  int health_interval_ms = 1000;
  int failures_to_down = 3;
  double prefix_weight = 2.0;
  EtcdFlags etcd;
  HttpFrontFlags http{.max_connections = 8192, .max_body_mb = 8};
};

int RunRouter(const RouterFlags& f) {
  router::RouterOptions options;
  PD_ASSIGN_OR_RETURN_CLI(HostPort listen, ParseHostPort("--listen", f.listen));
  options.host = listen.host;
  options.port = listen.port;
  options.nodes = f.nodes;
  options.api_key = ApiKeyFromFlagOrEnv(f.api_key);
  options.cluster_key = http::ClusterKeyFromFlagOrEnv(f.cluster_key);
  if (options.cluster_key.empty()) {
    PD_LOG_WARN("router: no cluster key (--cluster-key or {}): nodes cannot register",
                http::kClusterKeyEnv);
  }
  options.max_body_bytes = f.http.max_body_bytes();
  options.http_threads = f.http_threads;
  options.max_connections = f.http.max_connections;
  options.header_timeout_s = f.http.header_timeout_s;
  options.max_attempts = f.max_attempts;
  options.health_interval = std::chrono::milliseconds(f.health_interval_ms);
  options.pool.failures_to_down = f.failures_to_down;
  options.prefix_weight = f.prefix_weight;
  std::optional<http::MembershipOptions> membership_options;
  auto membership_metrics = std::make_shared<http::MembershipMetrics>();
  if (!f.etcd.endpoints.empty()) {
    PD_ASSIGN_OR_RETURN_CLI(membership_options, MembershipOptionsFromFlags(f.etcd));
    membership_options->metrics = membership_metrics;
    options.extra_metrics = [membership_metrics](MetricsText& out) {
      membership_metrics->Append(out);
    };
  }
  // Signals are blocked before any thread starts, so only the sigwait below receives them.
  TerminationSignals signals;
  PD_ASSIGN_OR_RETURN_CLI(auto front, router::Router::Create(options));
  if (Status s = front->Start(); !s.ok()) return Fail(s.ToString());
  std::unique_ptr<http::Membership> membership;
  if (membership_options) {
    // The nodes that serve generation: decode and colocated members.
    membership_options->watch_roles = {"decode", "colocated"};
    router::Router* r = front.get();
    membership_options->on_change = [r](const std::map<std::string, http::MemberRecord>& m) {
      std::vector<std::string> urls;
      for (const auto& [key, record] : m) urls.push_back(record.url);
      r->SetMembers(urls);
    };
    PD_ASSIGN_OR_RETURN_CLI(membership, http::Membership::Start(std::move(*membership_options)));
  }
  const int signal = signals.Wait();
  PD_LOG_INFO("router: signal {} received, stopping", signal);
  membership.reset();
  front->FinishDrain(Deadline::After(std::chrono::seconds(f.http.shutdown_grace_s)));
  front->Stop();
  return 0;
}

}  // namespace

void AddRouterCommand(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<RouterFlags>();
  CLI::App* cmd = app.add_subcommand(
      "router", "OpenAI-compatible front: spreads requests over nodes, relays streams");
  cmd->add_option("--listen", flags->listen, "HOST:PORT to serve on")->capture_default_str();
  cmd->add_option("--node", flags->nodes, "Node URL (http://host:port); repeat for several");
  cmd->add_option("--api-key", flags->api_key,
                  "Require Authorization: Bearer KEY (default: env PDSERVE_API_KEY)");
  cmd->add_option("--cluster-key", flags->cluster_key,
                  "Cluster secret that node registration must prove (default: env "
                  "PDSERVE_CLUSTER_KEY; none: registration is refused)");
  cmd->add_option("--http-threads", flags->http_threads, "HTTP threads (caps open streams)")
      ->check(CLI::Range(2, 4096))
      ->capture_default_str();
  cmd->add_option("--max-attempts", flags->max_attempts, "Nodes tried per request")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  cmd->add_option("--health-interval-ms", flags->health_interval_ms, "Health check period")
      ->check(CLI::Range(50, 60000))
      ->capture_default_str();
  cmd->add_option("--failures-to-down", flags->failures_to_down,
                  "Failed health checks before a node gets no traffic")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  cmd->add_option("--prefix-weight", flags->prefix_weight,
                  "Routing by prefix: outstanding requests a node holding the whole prompt's "
                  "prefix is preferred by (0: least outstanding only)")
      ->check(CLI::Range(0.0, 1000.0))
      ->capture_default_str();
  AddEtcdFlags(cmd, &flags->etcd);
  AddHttpFrontFlags(cmd, &flags->http);
  cmd->callback([flags, exit_code] { *exit_code = RunRouter(*flags); });
}

}  // namespace pdserve::cli
