#include "cli/router_process.h"

#include <pthread.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <ctime>

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

TerminationSignals::TerminationSignals() {
  sigemptyset(&set_);
  sigaddset(&set_, SIGINT);
  sigaddset(&set_, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set_, &old_);
}

TerminationSignals::~TerminationSignals() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }

int TerminationSignals::Wait() {
  for (;;) {
    int signal = 0;
    if (sigwait(&set_, &signal) == 0) return signal;
  }
}

int TerminationSignals::WaitFor(Duration timeout) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count();
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  const int signal = sigtimedwait(&set_, nullptr, &ts);
  return signal > 0 ? signal : 0;  // EAGAIN (timeout) and EINTR both mean "none yet"
}

}  // namespace pdserve::cli
