// Authentication of a cluster's internal HTTP endpoints (everything under /internal/: node
// registration with the router, a decode node reading a prefill node's messenger routes). The
// caller proves it holds the cluster secret — the one the KV messenger's handshake uses
// (--cluster-key / PDSERVE_CLUSTER_KEY) — without sending it: two headers carry the Unix time
// and HMAC-SHA-256(secret, "pdserve-internal\n" METHOD "\n" PATH "\n" TIME). A proof is
// accepted within kClusterProofWindow of the server's clock, so a copied one is soon useless.
// It does not cover the body. Pure functions; safe from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include <httplib.h>

#include "common/status.h"

namespace pdserve::http {

inline constexpr char kClusterTimeHeader[] = "X-Pdserve-Cluster-Time";
inline constexpr char kClusterProofHeader[] = "X-Pdserve-Cluster-Proof";
inline constexpr char kInternalPathPrefix[] = "/internal/";
inline constexpr char kClusterKeyEnv[] = "PDSERVE_CLUSTER_KEY";
inline constexpr std::chrono::seconds kClusterProofWindow{60};

// Seconds since the Unix epoch now (the proof's clock).
int64_t UnixNow();

// The headers that authenticate a `method` request for `path` under `cluster_key` at `now`.
httplib::Headers ClusterAuthHeaders(std::string_view cluster_key, std::string_view method,
                                    std::string_view path, int64_t now = UnixNow());

// Ok if `req` carries a valid proof under `cluster_key`. Otherwise
// FailedPrecondition when no key is configured, InvalidArgument for a missing, malformed,
// stale or wrong proof.
Status VerifyClusterAuth(const httplib::Request& req, std::string_view cluster_key,
                         int64_t now = UnixNow());

// `flag` if set, else $PDSERVE_CLUSTER_KEY, else "".
std::string ClusterKeyFromFlagOrEnv(const std::string& flag);

}  // namespace pdserve::http
