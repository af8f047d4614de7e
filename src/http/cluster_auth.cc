#include "http/cluster_auth.h"

#include <charconv>
#include <cstdlib>

#include "common/sha256.h"

namespace pdserve::http {
namespace {

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
                   int64_t time) {
  std::string message = "pdserve-internal\n";
  message.append(method).append("\n").append(path).append("\n").append(std::to_string(time));
  return HmacSha256(key, message);
}

}  // namespace

int64_t UnixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

httplib::Headers ClusterAuthHeaders(std::string_view cluster_key, std::string_view method,
                                    std::string_view path, int64_t now) {
  return {{kClusterTimeHeader, std::to_string(now)},
          {kClusterProofHeader, Hex(Proof(cluster_key, method, path, now))}};
}

Status VerifyClusterAuth(const httplib::Request& req, std::string_view cluster_key, int64_t now) {
  if (cluster_key.empty()) {
    return Status::FailedPrecondition(
        "internal endpoints are disabled: this process has no cluster key (--cluster-key or "
        "PDSERVE_CLUSTER_KEY)");
  }
  const std::string time_text = req.get_header_value(kClusterTimeHeader);
  const std::string given = req.get_header_value(kClusterProofHeader);
  if (time_text.empty() || given.empty()) {
    return Status::InvalidArgument("missing cluster proof (" + std::string(kClusterProofHeader) +
                                   ")");
  }
  int64_t time = 0;
  auto [end, ec] = std::from_chars(time_text.data(), time_text.data() + time_text.size(), time);
  if (ec != std::errc() || end != time_text.data() + time_text.size()) {
    return Status::InvalidArgument("malformed cluster proof time");
  }
  const int64_t window = kClusterProofWindow.count();
  if (time < now - window || time > now + window) {
    return Status::InvalidArgument("cluster proof outside the accepted time window");
  }
  // Compared as digests of the hex texts: equal lengths, constant time.
  const std::string expected = Hex(Proof(cluster_key, req.method, req.path, time));
  if (!ConstantTimeEqual(Sha256Hash(given), Sha256Hash(expected))) {
    return Status::InvalidArgument("wrong cluster proof");
  }
  return Status::Ok();
}

std::string ClusterKeyFromFlagOrEnv(const std::string& flag) {
  if (!flag.empty()) return flag;
  const char* env = std::getenv(kClusterKeyEnv);
  return env == nullptr ? std::string() : std::string(env);
}

}  // namespace pdserve::http
