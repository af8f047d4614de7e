// `pdserve serve`: one node of the serving cluster behind the OpenAI-compatible HTTP API of
// server/node_server.h. --role colocated: prefill and decode in one engine. --role prefill /
// decode: disaggregated, joined by the KV messenger (cli/serve_messenger.h, docs/messenger.md).
#include <signal.h>
#include <unistd.h>

#include <atomic>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "cli/etcd_flags.h"
#include "cli/http_flags.h"
#include "cli/model_flags.h"
#include "cli/router_process.h"
#include "cli/serve_messenger.h"
#include "cli/termination_signals.h"
#include "common/logging.h"
#include "http/cluster_auth.h"
#include "http/etcd_membership.h"
#include "http/node_url.h"
#include "kernels/dispatch.h"
#include "model/fingerprint.h"
#include "server/node_registration.h"
#include "server/node_server.h"

namespace pdserve::cli {
namespace {

struct ServeFlags {
  ModelFlags model;
  SpeculativeFlags speculative;
  MessengerFlags messenger;
  EtcdFlags etcd;
  std::string advertise_url;
  std::string role = "colocated";
  std::string listen = "127.0.0.1:8000";
  std::string api_key;
  std::string served_model_name;
  std::string router;
  int max_waiting = 256;
  int http_threads = 160;
  int request_timeout_s = 600;
  HttpFrontFlags http{.max_connections = 4096, .max_body_mb = 4};
  uint64_t seed = 0;
};

int RunServe(ServeFlags f) {
  PD_ASSIGN_OR_RETURN_CLI(const server::NodeRole role, server::ParseNodeRole(f.role));
  server::NodeServerOptions options;
  PD_ASSIGN_OR_RETURN_CLI(HostPort listen, ParseHostPort("--listen", f.listen));
  options.host = listen.host;
  options.port = listen.port;
  // A key in the environment stays out of `ps` (`pdserve up` hands its key over this way).
  options.api_key = ApiKeyFromFlagOrEnv(f.api_key);
  options.cluster_key = http::ClusterKeyFromFlagOrEnv(f.messenger.cluster_key);
  if (!f.router.empty() && options.cluster_key.empty()) {
    return Fail("--router needs the cluster secret the router was given (--cluster-key or " +
                std::string(http::kClusterKeyEnv) + "): registration is authenticated");
  }
  if (!f.messenger.decode_peers.empty() && role != server::NodeRole::kPrefill) {
    return Fail("--decode-peer is for --role prefill");
  }
  std::vector<std::string> decode_urls;  // normalised: http://host:port
  for (const std::string& peer : f.messenger.decode_peers) {
    Result<http::NodeAddress> address = http::ParseNodeUrl(peer);
    if (!address.ok()) return Fail("--decode-peer: " + address.status().message());
    decode_urls.push_back(address->url);
  }
  options.served_model_name = f.served_model_name.empty()
                                  ? std::filesystem::path(f.model.model).filename().string()
                                  : f.served_model_name;
  if (options.served_model_name.empty()) options.served_model_name = f.model.model;
  options.max_waiting = f.max_waiting;
  options.http_threads = f.http_threads;
  options.max_connections = f.http.max_connections;
  options.header_timeout_s = f.http.header_timeout_s;
  options.max_body_bytes = f.http.max_body_bytes();
  options.request_timeout_s = f.request_timeout_s;
  std::optional<http::MembershipOptions> membership_options;
  auto membership_metrics = std::make_shared<http::MembershipMetrics>();
  if (!f.etcd.endpoints.empty()) {
    Result<http::MembershipOptions> parsed = MembershipOptionsFromFlags(f.etcd);
    if (!parsed.ok()) return Fail(parsed.status().message());
    membership_options = std::move(parsed).value();
    membership_options->metrics = membership_metrics;
    if (f.advertise_url.empty() && (listen.host == "0.0.0.0" || listen.host == "::")) {
      return Fail("--etcd with --listen " + f.listen +
                  " needs --advertise-url: the address other hosts reach this node at");
    }
    options.extra_metrics = [membership_metrics](MetricsText& out) {
      membership_metrics->Append(out);
    };
  }
  if (!f.advertise_url.empty()) {
    Result<http::NodeAddress> advertised = http::ParseNodeUrl(f.advertise_url);
    if (!advertised.ok()) return Fail("--advertise-url: " + advertised.status().message());
  }

  // SIGINT/SIGTERM are taken synchronously by this thread (Wait below); every thread started
  // from here inherits the mask. A gone client must not kill the process.
  TerminationSignals signals;
  signal(SIGPIPE, SIG_IGN);

  // A tensor-parallel rank that dies leaves the node unable to compute: it stops, with exit
  // code 1, so that whatever runs it (pdserve up, systemd, Kubernetes) sees it and restarts it.
  std::atomic<bool> rank_failed{false};
  server::NodeServer node(options);
  if (Status s = node.Bind(); !s.ok()) return Fail(s.ToString());
  node.Start();  // /health answers 503 while the model loads
  PD_LOG_INFO("listening on http://{}:{} (loading {})", options.host, node.port(), f.model.model);

  // Before any kernel runs: a path this CPU lacks is an error here, not a SIGILL later.
  if (Status s = kernels::SelectPathFromEnvironment(); !s.ok()) return Fail(s.ToString());
  PD_LOG_INFO("kernels: {}", kernels::DescribeSelection());
  ApplySpeculativeToModel(f.speculative, &f.model);
  PD_ASSIGN_OR_RETURN_CLI(ModelDir dir, LoadFromFlags(f.model));
  EngineOptions engine_options = EngineOptionsFromFlags(f.model);
  engine_options.seed = f.seed;
  engine_options.tensor_parallel.on_failure = [&rank_failed](const Status& s) {
    PD_LOG_ERROR("{}: the node stops", s.ToString());
    rank_failed.store(true);
    kill(getpid(), SIGTERM);
  };
  if (f.speculative.method == "draft" && role == server::NodeRole::kPrefill) {
    return Fail(
        "--speculative draft is for the nodes that decode (a prefill node never samples; "
        "with --speculative mtp it writes the MTP module's KV for them)");
  }
  PD_ASSIGN_OR_RETURN_CLI(std::unique_ptr<Drafter> drafter,
                          MakeDrafterFromFlags(f.speculative, f.model, dir, &engine_options));
  if (role == server::NodeRole::kPrefill) engine_options.num_speculative_tokens = 0;
  server::ServedModel served;
  served.max_model_len = dir.config.MaxContext();
  served.tokenizer = std::move(dir.tokenizer);
  // The formats the model was loaded in, whatever flags asked for them (model/fingerprint.h).
  const std::string weights_identity =
      WeightsIdentity(dir.transformer->matrix_dtype(), dir.transformer->linear_dtype());
  PD_ASSIGN_OR_RETURN_CLI(served.engine,
                          Engine::Create(std::move(dir.transformer), served.tokenizer.get(),
                                         engine_options, std::move(drafter)));
  Engine* const engine = served.engine.get();  // the node owns it; it outlives the membership
  std::string fingerprint;
  if (role != server::NodeRole::kColocated) {
    // The handshake compares it field by field and names what differs (messenger/node_info.h).
    PD_ASSIGN_OR_RETURN_CLI(ModelIdentity identity,
                            IdentifyModel(dir.path, dir.config, weights_identity));
    identity.kv = f.model.mtp_kv ? "mtp" : "plain";
    fingerprint = identity.Serialize();
  }
  // Its messenger is destroyed with the served model: after node.Stop() stopped the engine,
  // before the engine.
  PD_ASSIGN_OR_RETURN_CLI(served.role,
                          MakeRoleFront(role, f.messenger, fingerprint, served.engine.get()));
  server::RoleFront* const front = served.role.get();  // as the engine
  if (Status s = node.SetModel(std::move(served)); !s.ok()) return Fail(s.ToString());
  // A line scripts and tests can wait for.
  std::printf("pdserve serve: ready on http://%s:%d model %s\n", options.host.c_str(), node.port(),
              options.served_model_name.c_str());
  std::fflush(stdout);

  const std::string own_url = "http://" + options.host + ":" + std::to_string(node.port());
  std::vector<std::unique_ptr<server::NodeRegistration>> registrations;
  if (!f.router.empty()) {
    registrations.push_back(
        std::make_unique<server::NodeRegistration>(f.router, own_url, options.cluster_key));
  }
  for (const std::string& url : decode_urls) {
    registrations.push_back(std::make_unique<server::NodeRegistration>(
        url, own_url, options.cluster_key, std::chrono::seconds(5), "/internal/messenger/join"));
  }
  std::unique_ptr<http::Membership> membership;
  if (membership_options) {
    // Registered once the model serves, under a lease it keeps alive; a decode node also
    // watches the prefill members and handshakes each (the cluster secret still decides).
    const std::string advertised =
        f.advertise_url.empty() ? own_url : http::ParseNodeUrl(f.advertise_url)->url;
    const std::string incarnation = NewIncarnation();
    const std::string role_name(server::NodeRoleName(role));
    const std::string model_name = options.served_model_name;
    membership_options->self = [=] {
      http::MemberRecord r;
      r.role = role_name;
      r.url = advertised;
      if (Result<std::string> a = front->InternalRoute("fabric_address"); a.ok()) {
        r.fabric_address = *a;
      }
      r.model = model_name;
      r.fingerprint = fingerprint;
      r.tp_size = engine->tp_size();
      r.incarnation = incarnation;
      const EngineStats stats = engine->stats();
      r.running = stats.running;
      r.waiting = stats.waiting;
      return r;
    };
    if (role == server::NodeRole::kDecode) {
      membership_options->watch_roles = {"prefill"};
      membership_options->on_change = MakePrefillWatcher(front, f.messenger.prefill_peers);
    }
    PD_ASSIGN_OR_RETURN_CLI(membership, http::Membership::Start(std::move(*membership_options)));
  }
  PD_LOG_INFO("signal {}: stopping", signals.Wait());
  // Out of the membership first: routers and decode nodes stop choosing this node while it
  // drains.
  membership.reset();
  registrations.clear();
  // Nothing can finish once a rank is gone: no grace.
  node.Drain(rank_failed.load() ? std::chrono::seconds(0)
                                : std::chrono::seconds(f.http.shutdown_grace_s));
  node.Stop();
  return rank_failed.load() ? 1 : 0;
}

}  // namespace

void AddServeCommand(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<ServeFlags>();
  CLI::App* cmd = app.add_subcommand("serve", "Serve a model over the OpenAI-compatible HTTP API");
  AddModelFlags(cmd, &flags->model, /*tensor_parallel=*/true);
  AddSpeculativeFlags(cmd, &flags->speculative);
  AddMessengerFlags(cmd, &flags->messenger);
  cmd->add_option("--role", flags->role, "colocated | prefill | decode")
      ->check(CLI::IsMember({"colocated", "prefill", "decode"}))
      ->capture_default_str();
  cmd->add_option("--listen", flags->listen, "HOST:PORT to listen on (port 0: any free port)")
      ->capture_default_str();
  cmd->add_option("--api-key", flags->api_key,
                  "Require 'Authorization: Bearer KEY' (default: env PDSERVE_API_KEY)");
  cmd->add_option("--served-model-name", flags->served_model_name,
                  "Model name in the API (default: the model directory's name)");
  AddEtcdFlags(cmd, &flags->etcd);
  cmd->add_option("--advertise-url", flags->advertise_url,
                  "With --etcd: the URL other hosts reach this node at (default: --listen's)");
  cmd->add_option("--router", flags->router,
                  "Router URL to register with (POST /internal/register every 5 s)");
  cmd->add_option("--max-waiting", flags->max_waiting,
                  "Requests awaiting a first token beyond which new ones get 503")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--http-threads", flags->http_threads, "HTTP worker threads")
      ->check(CLI::Range(4, 4096))
      ->capture_default_str();
  cmd->add_option("--request-timeout", flags->request_timeout_s,
                  "Seconds without output after which a request is cancelled")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  AddHttpFrontFlags(cmd, &flags->http);
  cmd->add_option("--seed", flags->seed, "Seed source for requests without a seed")
      ->capture_default_str();
  cmd->callback([flags, exit_code] { *exit_code = RunServe(*flags); });
}

}  // namespace pdserve::cli
