#include "cli/router_process.h"

#include <charconv>
#include <cstdlib>

namespace pdserve::cli {

Result<HostPort> ParseHostPort(const std::string& flag, const std::string& text) {
  const Status bad = Status::InvalidArgument(
      flag + " must be HOST:PORT with PORT in [0, 65535], got '" + text + "'");
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) return bad;
  HostPort out;
  out.host = text.substr(0, colon);
  const char* begin = text.data() + colon + 1;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(begin, end, out.port);
  if (ec != std::errc() || ptr != end || begin == end || out.port < 0 || out.port > 65535) {
    return bad;
  }
  return out;
}

std::string ApiKeyFromFlagOrEnv(const std::string& flag) {
  if (!flag.empty()) return flag;
  const char* env = std::getenv(kApiKeyEnv);
  return env == nullptr ? std::string() : std::string(env);
}

}  // namespace pdserve::cli
