#include "server/disagg_fronts.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "http/node_client.h"
#include "http/node_url.h"
#include "messenger/decode_messenger.h"
#include "messenger/node_info.h"
#include "messenger/prefill_messenger.h"

namespace pdserve::server {
namespace {

constexpr char kAddressRoute[] = "/internal/messenger/fabric_address";

// Asks a prefill node's HTTP API where its transfer engine is.
Result<fabric::TransferEngineAddress> ResolvePeer(const std::string& peer,
                                                  const std::string& cluster_key) {
  PD_ASSIGN_OR_RETURN(http::NodeAddress node, http::ParseNodeUrl(peer));
  // /internal/ routes answer only to a proof of the cluster secret (http/cluster_auth.h).
  http::NodeCallOptions options;
  options.cluster_key = cluster_key;
  Result<http::NodeReply> res = http::NodeGet(node, kAddressRoute, options);
  if (!res.ok()) return Status::Unavailable(fmt::format("prefill peer {} unreachable", peer));
  if (res->status == 401) {
    // Its /internal/ routes refused our proof: it holds another cluster secret. A refusal,
    // as a failed handshake would be (the messenger never sends it a memory descriptor).
    return Status::PermissionDenied(fmt::format(
        "prefill peer {} did not prove the cluster secret (HTTP 401 on {})", peer, kAddressRoute));
  }
  if (res->status != 200) {
    return Status::Unavailable(fmt::format("prefill peer {}: HTTP {}", peer, res->status));
  }
  return messenger::ParsePublishedAddress(res->body);
}

class PrefillFront final : public RoleFront {
 public:
  explicit PrefillFront(std::unique_ptr<messenger::PrefillMessenger> m)
      : m_(std::move(m)), address_(messenger::PublishedAddress(m_->address())) {}

  NodeRole role() const override { return NodeRole::kPrefill; }
  bool serves_generation() const override { return false; }

  Result<std::string> InternalRoute(std::string_view name) const override {
    if (name == "fabric_address") return address_;
    if (name == "events") return m_->events().ToJson();
    return RoleFront::InternalRoute(name);
  }

  void AppendMetrics(MetricsText& out) const override {
    const messenger::PrefillMessengerStats s = m_->stats();
    out.Gauge("pdserve:messenger_peers_ready", "Decode peers handshaken.", s.peers_ready)
        .Counter("pdserve:messenger_peer_readmissions_total",
                 "Removed decode peers (the same process) handshaken again.",
                 static_cast<double>(s.peers_readmitted))
        .Gauge("pdserve:messenger_requests_in_flight",
               "Prefill requests whose pages are held or streaming.", s.requests_in_flight)
        .Gauge("pdserve:messenger_outstanding_prefill_tokens",
               "Prompt tokens accepted and not yet prefilled.",
               static_cast<double>(s.outstanding_prefill_tokens))
        .Gauge("pdserve:messenger_prefill_tokens_per_second",
               "Measured prefill rate (prompt tokens per second of busy time, smoothed), as "
               "decode nodes are told; 0 before the first prefill ends.",
               s.prefill_tokens_per_second)
        .Counter("pdserve:messenger_requests_cancelled_total",
                 "Prefill requests stopped by a Cancel from their decode node.",
                 static_cast<double>(s.requests_cancelled))
        .Counter("pdserve:messenger_requests_failed_total",
                 "Prefill requests refused or failed (WriteFailed sent).",
                 static_cast<double>(s.requests_failed))
        .Counter("pdserve:messenger_requests_expired_total",
                 "Prefill requests stopped here because their deadline passed.",
                 static_cast<double>(s.requests_expired))
        .Counter("pdserve:messenger_kv_writes_sent_total",
                 "KV page writes to decode nodes that completed successfully.",
                 static_cast<double>(s.writes_sent))
        .Counter("pdserve:messenger_kv_bytes_sent_total", "Bytes of those writes.",
                 static_cast<double>(s.bytes_sent));
    // Per source rank: with a replicated cache (an MLA latent, fewer KV heads than ranks) each
    // request's writes come from the replicas the transfer plan chose for it.
    const std::pair<const char*, const std::vector<int64_t>*> by_rank[] = {
        {"pdserve:messenger_kv_rank_writes_sent_total", &s.writes_sent_by_rank},
        {"pdserve:messenger_kv_rank_bytes_sent_total", &s.bytes_sent_by_rank}};
    for (const auto& [name, values] : by_rank) {
      out.Family(name, MetricType::kCounter,
                 "KV writes (or their bytes) that completed, by the rank whose cache they read.");
      for (size_t r = 0; r < values->size(); ++r) {
        const std::string rank = std::to_string(r);
        out.Sample(name, {{"rank", rank}}, static_cast<double>((*values)[r]));
      }
    }
  }

 private:
  const std::unique_ptr<messenger::PrefillMessenger> m_;
  const std::string address_;  // hex of the encoded fabric::TransferEngineAddress
};

class DecodeFront final : public RoleFront {
 public:
  DecodeFront(std::unique_ptr<messenger::DecodeMessenger> m, std::string cluster_key)
      : m_(std::move(m)), cluster_key_(std::move(cluster_key)) {}

  // A peer named HOST:PORT (as --prefill-peer and X-Prefill-Peer name it), resolved over HTTP.
  static messenger::PrefillPeerSpec Spec(const std::string& name, const std::string& key) {
    return {.name = name, .resolve = [name, key] { return ResolvePeer(name, key); }};
  }

  NodeRole role() const override { return NodeRole::kDecode; }

  Status Submit(Engine&, EngineRequest request, const std::string& prefill_peer) override {
    return m_->Submit(std::move(request), prefill_peer);
  }

  std::string Degraded() const override { return m_->Degraded(); }

  // A joining prefill node names itself by URL; it is known as HOST:PORT, as --prefill-peer
  // names are (and as the X-Prefill-Peer header names it).
  Status Join(const http::NodeAddress& node) override {
    return m_->AddPeer(Spec(node.host + ":" + std::to_string(node.port), cluster_key_));
  }

  Status Leave(const http::NodeAddress& node) override {
    return m_->RemovePeer(node.host + ":" + std::to_string(node.port));
  }

  Result<std::string> InternalRoute(std::string_view name) const override {
    if (name == "events") return m_->events().ToJson();
    if (name == "peers") {
      // Each prefill peer's state and why it was last removed or refused (e.g. a wrong cluster
      // key or another model), for operators and tests.
      nlohmann::json peers = nlohmann::json::array();
      for (const messenger::PrefillPeerStatus& p : m_->stats().peers) {
        peers.push_back({{"name", p.name},
                         {"state", p.state},
                         {"refused", p.refused},
                         {"epoch", p.epoch},
                         {"last_error", p.last_error},
                         {"queued_tokens", p.queued_tokens},
                         {"prefill_tokens_per_second", p.prefill_tokens_per_second}});
      }
      return peers.dump();
    }
    return RoleFront::InternalRoute(name);
  }

  void AppendMetrics(MetricsText& out) const override {
    const messenger::DecodeMessengerStats s = m_->stats();
    int handshaking = 0, disconnected = 0, refused = 0, left = 0;
    for (const messenger::PrefillPeerStatus& p : s.peers) {
      const bool gone = p.state == "left";
      left += gone;
      refused += !gone && p.refused;
      handshaking += !p.refused && p.state == "handshaking";
      disconnected += !p.refused && p.state == "disconnected";
    }
    auto n = [](int64_t v) { return static_cast<double>(v); };
    out.Gauge("pdserve:messenger_peers_ready", "Prefill peers handshaken.", s.peers_ready)
        .Family("pdserve:messenger_peers", MetricType::kGauge, "Prefill peers by state.")
        .Sample("pdserve:messenger_peers", {{"state", "ready"}}, s.peers_ready)
        .Sample("pdserve:messenger_peers", {{"state", "handshaking"}}, handshaking)
        .Sample("pdserve:messenger_peers", {{"state", "disconnected"}}, disconnected)
        .Sample("pdserve:messenger_peers", {{"state", "refused"}}, refused)
        .Sample("pdserve:messenger_peers", {{"state", "left"}}, left)
        .Counter("pdserve:messenger_peer_readmissions_total",
                 "Removed prefill peers (the same process) handshaken again.",
                 n(s.peers_readmitted))
        .Counter("pdserve:decode_fallback_prefills_total",
                 "Prompts prefilled here because no prefill peer was usable.",
                 n(s.fallback_prefills))
        .Counter("pdserve:decode_admission_prefills_total",
                 "Prompts prefilled here because every prefill peer's estimated KV wait "
                 "exceeded the deadline (--admission local).",
                 n(s.admission_prefills))
        .Counter("pdserve:decode_admission_refusals_total",
                 "Requests refused at once (503, Retry-After) because every prefill peer's "
                 "estimated KV wait exceeded the deadline.",
                 n(s.admission_refusals))
        .Gauge("pdserve:messenger_requests_in_flight",
               "Requests submitted through the messenger and not finished.", s.requests_in_flight)
        .Gauge("pdserve:messenger_slots_in_use", "Transfer slots in use.", s.slots_in_use)
        .Counter("pdserve:messenger_requests_retried_total",
                 "Requests moved to another prefill peer.", n(s.requests_retried))
        .Counter("pdserve:messenger_requests_failed_total", "Requests failed by the messenger.",
                 n(s.requests_failed))
        .Counter("pdserve:messenger_requests_cancelled_total",
                 "Requests whose client went away while their KV was in flight (Cancel sent).",
                 n(s.requests_cancelled))
        .Counter("pdserve:decode_local_prefills_total",
                 "Prompts prefilled by this decode node (--local-prefill-max-tokens).",
                 n(s.local_prefills))
        .Counter("pdserve:decode_remote_prefills_total",
                 "Prompts sent to a prefill node to be prefilled.", n(s.requests_total))
        .Gauge("pdserve:messenger_requests_waiting_kv",
               "Requests queued for a prefill peer or whose KV is in flight.",
               s.requests_waiting_kv)
        .Counter("pdserve:messenger_requests_expired_total",
                 "Requests whose KV did not land (or found no prefill peer) by the deadline.",
                 n(s.requests_expired))
        .Counter("pdserve:messenger_kv_writes_received_total",
                 "KV page writes of transfers that landed completely.", n(s.writes_received))
        .Counter("pdserve:messenger_kv_bytes_received_total",
                 "Bytes of those writes (from the transfer plan).", n(s.bytes_received))
        .Counter("pdserve:messenger_kv_pages_not_transferred_total",
                 "Prompt pages this node's prefix cache held, so no prefill node sent them.",
                 n(s.pages_not_transferred))
        .Counter("pdserve:messenger_kv_bytes_not_transferred_total",
                 "Bytes of those pages over this node's ranks (what their writes would carry).",
                 n(s.bytes_not_transferred))
        .Histogram("pdserve:messenger_kv_transfer_latency_seconds",
                   "PrefillRequest sent to every expected KV write landed.",
                   s.transfer_latency_seconds);
  }

 private:
  const std::unique_ptr<messenger::DecodeMessenger> m_;
  const std::string cluster_key_;
};

}  // namespace

Result<std::unique_ptr<RoleFront>> MakePrefillFront(Engine* engine,
                                                    messenger::MessengerOptions options) {
  PD_ASSIGN_OR_RETURN(std::unique_ptr<messenger::PrefillMessenger> m,
                      messenger::PrefillMessenger::Create(engine, std::move(options)));
  return std::unique_ptr<RoleFront>(std::make_unique<PrefillFront>(std::move(m)));
}

Result<std::unique_ptr<RoleFront>> MakeDecodeFront(Engine* engine,
                                                   messenger::MessengerOptions options,
                                                   const std::vector<std::string>& prefill_peers) {
  std::vector<messenger::PrefillPeerSpec> peers;
  for (const std::string& p : prefill_peers) {
    peers.push_back(DecodeFront::Spec(p, options.cluster_key));
  }
  const std::string key = options.cluster_key;
  PD_ASSIGN_OR_RETURN(
      std::unique_ptr<messenger::DecodeMessenger> m,
      messenger::DecodeMessenger::Create(engine, std::move(options), std::move(peers)));
  return std::unique_ptr<RoleFront>(std::make_unique<DecodeFront>(std::move(m), key));
}

}  // namespace pdserve::server
