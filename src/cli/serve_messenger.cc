#include "cli/serve_messenger.h"

#include <cstdlib>

#include <fmt/format.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include "fabric/descriptors.h"
#include "http/cluster_auth.h"
#include "kernels/dispatch.h"
#include "router/router_nodes.h"

namespace pdserve::cli {
namespace {

constexpr char kAddressRoute[] = "/internal/messenger/fabric_address";

// "http://host:port" or "host:port" -> the base URL httplib takes.
std::string BaseUrl(const std::string& peer) {
  return peer.rfind("http://", 0) == 0 ? peer : "http://" + peer;
}

// Asks a prefill node's HTTP API where its transfer engine is.
Result<fabric::TransferEngineAddress> ResolvePeer(const std::string& peer,
                                                  const std::string& cluster_key) {
  httplib::Client client(BaseUrl(peer));
  client.set_connection_timeout(1, 0);
  client.set_read_timeout(2, 0);
  // /internal/ routes answer only to a proof of the cluster secret (http/cluster_auth.h).
  auto res = client.Get(kAddressRoute, http::ClusterAuthHeaders(cluster_key, "GET", kAddressRoute));
  if (!res) return Status::Unavailable(fmt::format("prefill peer {} unreachable", peer));
  if (res->status == 401) {
    // Its /internal/ routes refused our proof: it holds another cluster secret. A refusal,
    // as a failed handshake would be (the messenger never sends it a memory descriptor).
    return Status::PermissionDenied(fmt::format(
        "prefill peer {} did not prove the cluster secret (HTTP 401 on {})", peer, kAddressRoute));
  }
  if (res->status != 200) {
    return Status::Unavailable(fmt::format("prefill peer {}: HTTP {}", peer, res->status));
  }
  PD_ASSIGN_OR_RETURN(std::string bytes, fabric::HexDecode(res->body));
  return fabric::TransferEngineAddress::Parse(bytes);
}

std::string Gauge(const std::string& name, const std::string& help, double value) {
  return fmt::format("# HELP {0} {1}\n# TYPE {0} gauge\n{0} {2}\n", name, help, value);
}

std::string Counter(const std::string& name, const std::string& help, int64_t value) {
  return fmt::format("# HELP {0} {1}\n# TYPE {0} counter\n{0} {2}\n", name, help, value);
}

}  // namespace

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
  cmd->add_option("--kv-streaming", f->kv_streaming,
                  "Prefill role: post each layer's KV pages while the forward pass runs (on), "
                  "or all of a request's writes after its last forward pass (off)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
}

Result<NodeMessenger> StartMessenger(const std::string& role, const MessengerFlags& flags,
                                     const std::string& fingerprint, Engine* engine,
                                     server::ServedModel* served) {
  messenger::MessengerOptions options;
  PD_ASSIGN_OR_RETURN(options.fabric.provider, fabric::ParseProvider(flags.provider));
  if (options.fabric.provider == fabric::Provider::kTcp) options.fabric.node = flags.address;
  options.fabric.pin_progress_threads = false;  // nodes share this machine's few cores
  options.cluster_key = http::ClusterKeyFromFlagOrEnv(flags.cluster_key);
  if (options.cluster_key.empty()) {
    return Status::InvalidArgument("--role " + role +
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

  NodeMessenger node;
  if (role == "prefill") {
    if (!flags.prefill_peers.empty()) {
      return Status::InvalidArgument("--prefill-peer is for --role decode");
    }
    PD_ASSIGN_OR_RETURN(node.prefill, messenger::PrefillMessenger::Create(engine, options));
    messenger::PrefillMessenger* m = node.prefill.get();
    const std::string address = fabric::HexEncode(m->address().Serialize());
    served->api_enabled = false;
    served->internal_routes["fabric_address"] = [address] { return address; };
    served->internal_routes["events"] = [m] { return m->events().ToJson(); };
    served->extra_metrics = [m] {
      const messenger::PrefillMessengerStats s = m->stats();
      return Gauge("pdserve:messenger_peers_ready", "Decode peers handshaken.", s.peers_ready) +
             Counter("pdserve:messenger_peer_readmissions_total",
                     "Removed decode peers (the same process) handshaken again.",
                     s.peers_readmitted) +
             Gauge("pdserve:messenger_requests_in_flight",
                   "Prefill requests whose pages are held or streaming.", s.requests_in_flight) +
             Gauge("pdserve:messenger_outstanding_prefill_tokens",
                   "Prompt tokens accepted and not yet prefilled.",
                   static_cast<double>(s.outstanding_prefill_tokens)) +
             Gauge("pdserve:messenger_requests_cancelled",
                   "Prefill requests stopped by a Cancel from their decode node.",
                   static_cast<double>(s.requests_cancelled)) +
             Gauge("pdserve:messenger_requests_failed",
                   "Prefill requests refused or failed (WriteFailed sent).",
                   static_cast<double>(s.requests_failed)) +
             Counter("pdserve:messenger_requests_expired_total",
                     "Prefill requests stopped here because their deadline passed.",
                     s.requests_expired) +
             Counter("pdserve:messenger_kv_writes_sent_total",
                     "KV page writes to decode nodes that completed successfully.", s.writes_sent) +
             Counter("pdserve:messenger_kv_bytes_sent_total", "Bytes of those writes.",
                     s.bytes_sent);
    };
    return node;
  }
  // Without --prefill-peer, prefill nodes join it (--decode-peer); requests wait for one up to
  // their prefill deadline.
  auto spec = [key = options.cluster_key](const std::string& p) {
    return messenger::PrefillPeerSpec{.name = p,
                                      .resolve = [p, key] { return ResolvePeer(p, key); }};
  };
  std::vector<messenger::PrefillPeerSpec> peers;
  for (const std::string& p : flags.prefill_peers) peers.push_back(spec(p));
  PD_ASSIGN_OR_RETURN(node.decode,
                      messenger::DecodeMessenger::Create(engine, options, std::move(peers)));
  messenger::DecodeMessenger* m = node.decode.get();
  // A joining prefill node names itself by URL; it is known as HOST:PORT, as --prefill-peer
  // names are (and as the X-Prefill-Peer header names it).
  served->join = [m, spec](const std::string& url) -> Status {
    PD_ASSIGN_OR_RETURN(router::NodeAddress address, router::ParseNodeUrl(url));
    return m->AddPeer(spec(address.host + ":" + std::to_string(address.port)));
  };
  served->internal_routes["events"] = [m] { return m->events().ToJson(); };
  served->degraded = [m] { return m->Degraded(); };
  served->submit = [m](EngineRequest request, const std::string& peer) {
    return m->Submit(std::move(request), peer);
  };
  // Each prefill peer's state and why it was last removed or refused (e.g. a wrong cluster
  // key or another model), for operators and tests.
  served->internal_routes["peers"] = [m] {
    nlohmann::json peers = nlohmann::json::array();
    for (const messenger::PrefillPeerStatus& p : m->stats().peers) {
      peers.push_back({{"name", p.name},
                       {"state", p.state},
                       {"refused", p.refused},
                       {"epoch", p.epoch},
                       {"last_error", p.last_error}});
    }
    return peers.dump();
  };
  served->extra_metrics = [m] {
    const messenger::DecodeMessengerStats s = m->stats();
    int handshaking = 0, disconnected = 0, refused = 0;
    for (const messenger::PrefillPeerStatus& p : s.peers) {
      refused += p.refused;
      handshaking += !p.refused && p.state == "handshaking";
      disconnected += !p.refused && p.state == "disconnected";
    }
    return Gauge("pdserve:messenger_peers_ready", "Prefill peers handshaken.", s.peers_ready) +
           fmt::format(
               "# HELP pdserve:messenger_peers Prefill peers by state.\n"
               "# TYPE pdserve:messenger_peers gauge\n"
               "pdserve:messenger_peers{{state=\"ready\"}} {}\n"
               "pdserve:messenger_peers{{state=\"handshaking\"}} {}\n"
               "pdserve:messenger_peers{{state=\"disconnected\"}} {}\n"
               "pdserve:messenger_peers{{state=\"refused\"}} {}\n",
               s.peers_ready, handshaking, disconnected, refused) +
           Counter("pdserve:messenger_peer_readmissions_total",
                   "Removed prefill peers (the same process) handshaken again.",
                   s.peers_readmitted) +
           Counter("pdserve:decode_fallback_prefills_total",
                   "Prompts prefilled here because no prefill peer was usable.",
                   s.fallback_prefills) +
           Gauge("pdserve:messenger_requests_in_flight",
                 "Requests submitted through the messenger and not finished.",
                 s.requests_in_flight) +
           Gauge("pdserve:messenger_slots_in_use", "Transfer slots in use.", s.slots_in_use) +
           Gauge("pdserve:messenger_requests_retried", "Requests moved to another prefill peer.",
                 static_cast<double>(s.requests_retried)) +
           Gauge("pdserve:messenger_requests_failed", "Requests failed by the messenger.",
                 static_cast<double>(s.requests_failed)) +
           Gauge("pdserve:messenger_requests_cancelled",
                 "Requests whose client went away while their KV was in flight (Cancel sent).",
                 static_cast<double>(s.requests_cancelled)) +
           Counter("pdserve:decode_local_prefills_total",
                   "Prompts prefilled by this decode node (--local-prefill-max-tokens).",
                   s.local_prefills) +
           Counter("pdserve:decode_remote_prefills_total",
                   "Prompts sent to a prefill node to be prefilled.", s.requests_total) +
           Gauge("pdserve:messenger_requests_waiting_kv",
                 "Requests queued for a prefill peer or whose KV is in flight.",
                 s.requests_waiting_kv) +
           Counter("pdserve:messenger_requests_expired_total",
                   "Requests whose KV did not land (or found no prefill peer) by the deadline.",
                   s.requests_expired) +
           Counter("pdserve:messenger_kv_writes_received_total",
                   "KV page writes of transfers that landed completely.", s.writes_received) +
           Counter("pdserve:messenger_kv_bytes_received_total",
                   "Bytes of those writes (from the transfer plan).", s.bytes_received) +
           [&s] {
             std::string out;
             s.transfer_latency_seconds.Render(
                 "pdserve:messenger_kv_transfer_latency_seconds",
                 "PrefillRequest sent to every expected KV write landed.", &out);
             return out;
           }();
  };
  return node;
}

}  // namespace pdserve::cli
