// The flags of an HTTP front that `pdserve serve` and `pdserve router` share — the listener's
// limits and the draining shutdown — with one spelling, check and help text (docs/api.md).
// Used from main() only (single-threaded).
#pragma once

#include <cstddef>

#include <CLI/CLI.hpp>

namespace pdserve::cli {

struct HttpFrontFlags {
  size_t max_connections = 4096;
  int header_timeout_s = 10;
  int max_body_mb = 4;
  int shutdown_grace_s = 30;

  size_t max_body_bytes() const { return static_cast<size_t>(max_body_mb) << 20; }
};

// --max-connections, --header-timeout, --max-body-mb and --shutdown-grace-s, their defaults the
// values `flags` holds when called.
void AddHttpFrontFlags(CLI::App* cmd, HttpFrontFlags* flags);
// --shutdown-grace-s alone (`pdserve up` hands it to its router and nodes).
void AddShutdownGraceFlag(CLI::App* cmd, int* seconds);

}  // namespace pdserve::cli
