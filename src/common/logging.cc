#include "common/logging.h"

#include <cstdlib>
#include <mutex>
#include <utility>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace pdserve {

bool SetLogLevel(std::string_view level) {
  // spdlog::level::from_str maps an unknown name to "off", which would silence every log.
  static constexpr std::pair<std::string_view, spdlog::level::level_enum> kLevels[] = {
      {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug},
      {"info", spdlog::level::info},   {"warn", spdlog::level::warn},
      {"error", spdlog::level::err},   {"critical", spdlog::level::critical},
      {"off", spdlog::level::off}};
  for (const auto& [name, value] : kLevels) {
    if (level == name) {
      spdlog::set_level(value);
      return true;
    }
  }
  return false;
}

void InitLogging() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto logger = spdlog::stderr_color_mt("pdserve");
    spdlog::set_default_logger(logger);
    spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ [%P] %v");
    SetLogLevel("info");
    const char* env = std::getenv("PDSERVE_LOG_LEVEL");
    if (env != nullptr && !SetLogLevel(env)) {
      PD_LOG_WARN(
          "PDSERVE_LOG_LEVEL='{}' names no level (trace, debug, info, warn, error, critical, "
          "off): logging at info",
          env);
    }
  });
}

}  // namespace pdserve
