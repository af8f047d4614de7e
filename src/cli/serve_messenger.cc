#include "cli/serve_messenger.h"

#include "fabric/config.h"
#include "http/cluster_auth.h"
#include "kernels/dispatch.h"
#include "server/disagg_fronts.h"

namespace pdserve::cli {

void AddMessengerFlags(CLI::App* cmd, MessengerFlags* f) {
  cmd->add_option("--fabric-provider", f->provider, "KV transfer provider: tcp | shm")
      ->check(CLI::IsMember({"tcp", "shm"}))
      ->capture_default_str();
  cmd->add_option("--fabric-address", f->address,
                  "Local address the KV transfer endpoints bind to (tcp)")
      ->capture_default_str();
  cmd->add_option("--prefill-peer", f->prefill_peers,
                  "Decode role: a prefill node's HTTP HOST:PORT (repeatable)");
  cmd->add_option("--decode-peer", f->decode_peers,
                  "Prefill role: join the running decode node at this HTTP URL (repeatable); "
                  "it is asked again every 5 s, so either may start first or restart");
  cmd->add_option("--cluster-key", f->cluster_key,
                  "Shared secret of the cluster's nodes (default: env PDSERVE_CLUSTER_KEY)");
  cmd->add_option("--heartbeat-ms", f->heartbeat_ms, "Messenger heartbeat interval")
      ->check(CLI::Range(10, 60000))
      ->capture_default_str();
  cmd->add_option("--peer-timeout-ms", f->peer_timeout_ms,
                  "A messenger peer silent this long is removed")
      ->check(CLI::Range(50, 600000))
      ->capture_default_str();
  cmd->add_option("--local-prefill-max-tokens", f->local_prefill_max_tokens,
                  "Decode role: prompts of at most this many tokens are prefilled here, not sent "
                  "to a prefill node (0: never)")
      ->check(CLI::Range(0, 1 << 24))
      ->capture_default_str();
  cmd->add_option("--local-prefill-fallback", f->local_prefill_fallback,
                  "Decode role: with no usable prefill peer, prefill a prompt here (on), or "
                  "refuse it at once with 503 and Retry-After (off)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_option("--prefill-timeout-ms", f->prefill_timeout_ms,
                  "Decode role: how long a prompt's KV may take to land")
      ->check(CLI::Range(100, 3600000))
      ->capture_default_str();
  cmd->add_option("--admission", f->admission,
                  "Decode role: a request whose estimated KV wait (the least loaded prefill "
                  "peer's queued tokens over its measured rate) exceeds --prefill-timeout-ms is "
                  "prefilled here while there is room, else refused with 503 and Retry-After "
                  "(local), always refused (refuse), or left to wait (off)")
      ->check(CLI::IsMember({"off", "refuse", "local"}))
      ->capture_default_str();
  cmd->add_option("--admission-local-max-tokens", f->admission_local_max_tokens,
                  "Decode role: --admission local prefills here while this node's unfinished "
                  "admission prefills hold at most this many prompt tokens (the new one included)")
      ->check(CLI::Range(0, 1 << 24))
      ->capture_default_str();
  cmd->add_option("--kv-streaming", f->kv_streaming,
                  "Prefill role: post each layer's KV pages while the forward pass runs (on), "
                  "or all of a request's writes after its last forward pass (off)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
}

Result<std::unique_ptr<server::RoleFront>> MakeRoleFront(server::NodeRole role,
                                                         const MessengerFlags& flags,
                                                         const std::string& fingerprint,
                                                         Engine* engine) {
  const std::string role_name(server::NodeRoleName(role));
  if (role == server::NodeRole::kColocated) return std::make_unique<server::RoleFront>();
  if (role == server::NodeRole::kPrefill && !flags.prefill_peers.empty()) {
    return Status::InvalidArgument("--prefill-peer is for --role decode");
  }
  messenger::MessengerOptions options;
  PD_ASSIGN_OR_RETURN(options.fabric.provider, fabric::ParseProvider(flags.provider));
  if (options.fabric.provider == fabric::Provider::kTcp) options.fabric.node = flags.address;
  options.fabric.pin_progress_threads = false;  // nodes share this machine's few cores
  options.cluster_key = http::ClusterKeyFromFlagOrEnv(flags.cluster_key);
  if (options.cluster_key.empty()) {
    return Status::InvalidArgument("--role " + role_name +
                                   " needs a cluster secret: --cluster-key or PDSERVE_CLUSTER_KEY");
  }
  options.model_fingerprint = fingerprint;
  options.kernel_path = kernels::ArithmeticIdentity();
  options.heartbeat_interval = std::chrono::milliseconds(flags.heartbeat_ms);
  options.peer_timeout = std::chrono::milliseconds(flags.peer_timeout_ms);
  options.handshake_timeout = std::chrono::milliseconds(flags.peer_timeout_ms);
  options.prefill_timeout = std::chrono::milliseconds(flags.prefill_timeout_ms);
  options.local_prefill_max_tokens = flags.local_prefill_max_tokens;
  options.local_prefill_fallback = flags.local_prefill_fallback != "off";
  options.kv_streaming = flags.kv_streaming != "off";
  options.admission = flags.admission == "off"      ? messenger::AdmissionPolicy::kOff
                      : flags.admission == "refuse" ? messenger::AdmissionPolicy::kRefuse
                                                    : messenger::AdmissionPolicy::kLocal;
  options.admission_local_max_tokens = flags.admission_local_max_tokens;
  if (role == server::NodeRole::kPrefill) {
    return server::MakePrefillFront(engine, std::move(options));
  }
  // Without --prefill-peer, prefill nodes join it (--decode-peer); until one does, requests
  // are prefilled here (or refused with --local-prefill-fallback off).
  return server::MakeDecodeFront(engine, std::move(options), flags.prefill_peers);
}

}  // namespace pdserve::cli
