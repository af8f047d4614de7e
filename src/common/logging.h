// Logging through spdlog. Call from any thread (spdlog's default logger is thread-safe).
// Use PD_LOG_INFO("format {}", args...) and friends; the level comes from PDSERVE_LOG_LEVEL
// (trace|debug|info|warn|error|critical|off; default info) or SetLogLevel().
#pragma once

#include <string_view>

#include <fmt/format.h>

// spdlog formats every message through fmt::detail::vformat_to<char>, which libfmt 9 compiles
// into its library without declaring it extern in its headers: each file that logged compiled
// fmt's whole formatting engine again (about 2 s of -O3 and 80 KB of code per file). Declared
// here, they call the library's copy (fmt 10's own headers declare it).
#if defined(SPDLOG_FMT_EXTERNAL) && !defined(FMT_HEADER_ONLY) && FMT_VERSION >= 90000 && \
    FMT_VERSION < 100000
namespace fmt {
inline namespace v9 {
namespace detail {
extern template FMT_API void vformat_to<char>(buffer<char>&, string_view, format_args, locale_ref);
}  // namespace detail
}  // namespace v9
}  // namespace fmt
#endif

#include <spdlog/spdlog.h>

namespace pdserve {

// Reads PDSERVE_LOG_LEVEL once and configures the default logger (stderr); a value that names
// no level is warned about and logging stays at info. Idempotent.
void InitLogging();
// Sets the level by name (as PDSERVE_LOG_LEVEL); false, and nothing changed, for another name.
bool SetLogLevel(std::string_view level);

}  // namespace pdserve

#define PD_LOG_TRACE(...) SPDLOG_TRACE(__VA_ARGS__)
#define PD_LOG_DEBUG(...) SPDLOG_DEBUG(__VA_ARGS__)
#define PD_LOG_INFO(...) SPDLOG_INFO(__VA_ARGS__)
#define PD_LOG_WARN(...) SPDLOG_WARN(__VA_ARGS__)
#define PD_LOG_ERROR(...) SPDLOG_ERROR(__VA_ARGS__)
// At a level chosen at run time (spdlog::level::...).
#define PD_LOG_AT(level, ...) SPDLOG_LOGGER_CALL(spdlog::default_logger_raw(), level, __VA_ARGS__)
