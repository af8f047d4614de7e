#include "http/request_id.h"

#include <algorithm>
#include <cstdint>
#include <random>

namespace pdserve::http {

bool IsSafeRequestId(std::string_view id) {
  if (id.empty() || id.size() > kMaxRequestIdLength) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_' || c == '.' || c == ':';
  });
}

std::string NewRequestId() {
  // One generator per thread: no lock on the request path, and seeded once per thread.
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = "req-";
  uint64_t v = rng();
  for (int i = 0; i < 16; ++i, v >>= 4) id += kHex[v & 15];
  return id;
}

std::string ChooseRequestId(std::string_view client_id) {
  return IsSafeRequestId(client_id) ? std::string(client_id) : NewRequestId();
}

}  // namespace pdserve::http
