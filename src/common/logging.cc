#include "common/logging.h"

#include <cstdlib>
#include <mutex>
#include <string>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace pdserve {

void SetLogLevel(std::string_view level) {
  spdlog::set_level(spdlog::level::from_str(std::string(level)));
}

void InitLogging() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto logger = spdlog::stderr_color_mt("pdserve");
    spdlog::set_default_logger(logger);
    spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ [%P] %v");
    const char* env = std::getenv("PDSERVE_LOG_LEVEL");
    SetLogLevel(env != nullptr ? env : "info");
  });
}

}  // namespace pdserve
