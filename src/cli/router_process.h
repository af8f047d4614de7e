// Process plumbing shared by `pdserve router`, `pdserve up` and `pdserve serve`: HOST:PORT
// parsing and the API key from flag or environment (their signal policy is
// cli/termination_signals.h). Used from main()'s thread only.
#pragma once

#include <string>

#include "common/status.h"

namespace pdserve::cli {

struct HostPort {
  std::string host;
  int port = 0;
};
// "HOST:PORT" with PORT in [0, 65535] (0: any free port); the error names `flag`.
Result<HostPort> ParseHostPort(const std::string& flag, const std::string& text);

// The API key may come from the environment instead of a flag, which every local user can read
// in `ps`; `pdserve up` hands its key to its nodes this way.
inline constexpr char kApiKeyEnv[] = "PDSERVE_API_KEY";
// `flag` if set, else $PDSERVE_API_KEY, else "".
std::string ApiKeyFromFlagOrEnv(const std::string& flag);

}  // namespace pdserve::cli
