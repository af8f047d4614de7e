#include "cli/http_flags.h"

namespace pdserve::cli {

void AddHttpFrontFlags(CLI::App* cmd, HttpFrontFlags* flags) {
  cmd->add_option("--max-connections", flags->max_connections,
                  "Open client connections beyond which new ones get 503")
      ->check(CLI::Range(size_t{1}, size_t{1} << 20))
      ->capture_default_str();
  cmd->add_option("--header-timeout", flags->header_timeout_s,
                  "Seconds a request's head (request line and headers) may take to arrive")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  cmd->add_option("--max-body-mb", flags->max_body_mb, "Largest request body in MiB")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  AddShutdownGraceFlag(cmd, &flags->shutdown_grace_s);
}

void AddShutdownGraceFlag(CLI::App* cmd, int* seconds) {
  cmd->add_option("--shutdown-grace-s", *seconds,
                  "On SIGTERM/SIGINT: seconds requests in flight may take to finish before they "
                  "are ended with an error (new ones get 503 at once)")
      ->check(CLI::Range(0, 86400))
      ->capture_default_str();
}

}  // namespace pdserve::cli
