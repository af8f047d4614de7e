#include "http/cluster_auth.h"

#include <charconv>
#include <cstdlib>
#include <random>

#include "common/sha256.h"

namespace pdserve::http {
namespace {

constexpr size_t kNonceDigits = 32;

std::string Hex(const Sha256Digest& digest) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(digest.size() * 2);
  for (uint8_t b : digest) {
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}

Sha256Digest Proof(std::string_view key, std::string_view method, std::string_view path,
                   int64_t time, std::string_view nonce, std::string_view body) {
  std::string message = "pdserve-internal-v2\n";
  message.append(method).append("\n").append(path).append("\n").append(std::to_string(time));
  message.append("\n").append(nonce).append("\n").append(Hex(Sha256Hash(body)));
  return HmacSha256(key, message);
}

bool IsLowerHex(std::string_view text, size_t digits) {
  if (text.size() != digits) return false;
  for (const char c : text) {
    if ((c < '0' || c > '9') && (c < 'a' || c > 'f')) return false;
  }
  return true;
}

}  // namespace

int64_t UnixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string NewClusterNonce() {
  // The system's random source: a nonce only has to be unique, but a predictable one would let
  // an observer who can reach a process before the cluster does spend proofs ahead of them.
  std::random_device source;
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string nonce;
  while (nonce.size() < kNonceDigits) {
    for (uint32_t v = source(), i = 0; i < 8 && nonce.size() < kNonceDigits; ++i, v >>= 4) {
      nonce += kDigits[v & 15];
    }
  }
  return nonce;
}

httplib::Headers ClusterAuthHeaders(std::string_view cluster_key, std::string_view method,
                                    std::string_view path, std::string_view body, int64_t now,
                                    const std::string& nonce) {
  return {{kClusterTimeHeader, std::to_string(now)},
          {kClusterNonceHeader, nonce},
          {kClusterProofHeader, Hex(Proof(cluster_key, method, path, now, nonce, body))}};
}

Result<ClusterProofStamp> VerifyClusterAuth(const httplib::Request& req,
                                            std::string_view cluster_key, int64_t now) {
  if (cluster_key.empty()) {
    return Status::FailedPrecondition(
        "internal endpoints are disabled: this process has no cluster key (--cluster-key or "
        "PDSERVE_CLUSTER_KEY)");
  }
  const std::string time_text = req.get_header_value(kClusterTimeHeader);
  const std::string nonce = req.get_header_value(kClusterNonceHeader);
  const std::string given = req.get_header_value(kClusterProofHeader);
  if (time_text.empty() || nonce.empty() || given.empty()) {
    return Status::InvalidArgument("missing cluster proof (" + std::string(kClusterProofHeader) +
                                   ", " + kClusterNonceHeader + ", " + kClusterTimeHeader + ")");
  }
  int64_t time = 0;
  auto [end, ec] = std::from_chars(time_text.data(), time_text.data() + time_text.size(), time);
  if (ec != std::errc() || end != time_text.data() + time_text.size()) {
    return Status::InvalidArgument("malformed cluster proof time");
  }
  if (!IsLowerHex(nonce, kNonceDigits)) {
    return Status::InvalidArgument("malformed cluster proof nonce (32 lower-case hex digits)");
  }
  const int64_t window = kClusterProofWindow.count();
  if (time < now - window || time > now + window) {
    return Status::InvalidArgument("cluster proof outside the accepted time window");
  }
  // Compared as digests of the hex texts: equal lengths, constant time.
  const std::string expected = Hex(Proof(cluster_key, req.method, req.path, time, nonce, req.body));
  if (!ConstantTimeEqual(Sha256Hash(given), Sha256Hash(expected))) {
    return Status::InvalidArgument("wrong cluster proof (another secret, request or body)");
  }
  return ClusterProofStamp{nonce, time + window};
}

std::string ClusterKeyFromFlagOrEnv(const std::string& flag) {
  if (!flag.empty()) return flag;
  const char* env = std::getenv(kClusterKeyEnv);
  return env == nullptr ? std::string() : std::string(env);
}

}  // namespace pdserve::http
