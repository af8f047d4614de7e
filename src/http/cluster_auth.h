// Authentication of a cluster's internal HTTP endpoints (everything under /internal/: node
// registration with the router, a decode node reading a prefill node's messenger routes, a
// prefill node joining a decode node). The caller proves it holds the cluster secret — the
// one the KV messenger's handshake uses (--cluster-key / PDSERVE_CLUSTER_KEY) — without
// sending it: three headers carry the Unix time, a fresh random nonce and
// HMAC-SHA-256(secret, "pdserve-internal-v2\n" METHOD "\n" PATH "\n" TIME "\n" NONCE "\n"
// hex(SHA-256(BODY))). So a proof covers one request: its method, path (without a query) and
// body (empty for one without). A proof is accepted within kClusterProofWindow of the
// server's clock, and, by ClusterProofReplayCache (http/cluster_proof_cache.h), once: internal
// traffic is plain HTTP, so whoever sees a proof on the wire can send it again, but only the
// same request, and only before the original arrives (a copy that wins the race takes its
// place, and the original is refused). What remains open is the same request sent to another
// process that shares the secret, within the window.
// The proof itself is a pure function of its inputs; ClusterAuthHeaders takes the clock and a
// fresh nonce by default. Safe from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include <httplib.h>

#include "common/status.h"

namespace pdserve::http {

inline constexpr char kClusterTimeHeader[] = "X-Pdserve-Cluster-Time";
inline constexpr char kClusterNonceHeader[] = "X-Pdserve-Cluster-Nonce";
inline constexpr char kClusterProofHeader[] = "X-Pdserve-Cluster-Proof";
inline constexpr char kInternalPathPrefix[] = "/internal/";
inline constexpr char kClusterKeyEnv[] = "PDSERVE_CLUSTER_KEY";
inline constexpr std::chrono::seconds kClusterProofWindow{60};

// Seconds since the Unix epoch now (the proof's clock).
int64_t UnixNow();

// 32 random hex digits (128 bits from the system's random source).
std::string NewClusterNonce();

// The headers that authenticate a `method` request for `path` carrying `body` (empty for
// none) under `cluster_key`, made at `now` with `nonce`. `path` is the path as sent, without
// a query (the server checks its decoded path).
httplib::Headers ClusterAuthHeaders(std::string_view cluster_key, std::string_view method,
                                    std::string_view path, std::string_view body = {},
                                    int64_t now = UnixNow(),
                                    const std::string& nonce = NewClusterNonce());

// What tells one accepted proof from another, for the replay check.
struct ClusterProofStamp {
  std::string nonce;
  int64_t expires = 0;  // Unix seconds: past this, the proof is stale anyway
};

// The stamp of the proof `req` (its body read whole) carries, if it is valid under
// `cluster_key` and made within the window around `now`. Otherwise FailedPrecondition when no
// key is configured, InvalidArgument for a missing, malformed, stale or wrong proof. Says
// nothing of replays: see ClusterProofReplayCache.
Result<ClusterProofStamp> VerifyClusterAuth(const httplib::Request& req,
                                            std::string_view cluster_key, int64_t now = UnixNow());

// `flag` if set, else $PDSERVE_CLUSTER_KEY, else "".
std::string ClusterKeyFromFlagOrEnv(const std::string& flag);

}  // namespace pdserve::http
