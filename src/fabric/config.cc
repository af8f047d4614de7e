#include "fabric/config.h"

#include <fmt/format.h>

namespace pdserve::fabric {

Result<Provider> ParseProvider(std::string_view name) {
  if (name == "shm") return Provider::kShm;
  if (name == "tcp") return Provider::kTcp;
  if (name == "verbs") return Provider::kVerbs;
  if (name == "efa") return Provider::kEfa;
  return Status::InvalidArgument(
      fmt::format("unknown fabric provider '{}' (expected shm, tcp, verbs or efa)", name));
}

std::string_view ProviderName(Provider provider) {
  switch (provider) {
    case Provider::kShm:
      return "shm";
    case Provider::kTcp:
      return "tcp";
    case Provider::kVerbs:
      return "verbs";
    case Provider::kEfa:
      return "efa";
  }
  return "unknown";
}

std::string_view LibfabricProviderString(Provider provider) {
  switch (provider) {
    case Provider::kShm:
      return "shm";
    case Provider::kTcp:
      return "tcp;ofi_rxm";  // RDM over TCP needs the rxm utility provider on top
    case Provider::kVerbs:
      return "verbs;ofi_rxm";
    case Provider::kEfa:
      return "efa";
  }
  return "";
}

Status ValidateConfig(const FabricConfig& config) {
  if (config.num_domains < 1 || config.num_domains > 64) {
    return Status::InvalidArgument(
        fmt::format("fabric num_domains must be in [1, 64], got {}", config.num_domains));
  }
  if (config.max_message_bytes < 64 || config.max_message_bytes > (64u << 20)) {
    return Status::InvalidArgument(fmt::format(
        "fabric max_message_bytes must be in [64, 64 MiB], got {}", config.max_message_bytes));
  }
  if (config.receive_buffers < 1 || config.receive_buffers > 4096) {
    return Status::InvalidArgument(
        fmt::format("fabric receive_buffers must be in [1, 4096], got {}", config.receive_buffers));
  }
  if (config.default_transfer_timeout.count() <= 0) {
    return Status::InvalidArgument("fabric default_transfer_timeout must be positive");
  }
  if (config.idle_poll_max.count() < 0) {
    return Status::InvalidArgument("fabric idle_poll_max must not be negative");
  }
  if (!config.progress_cpus.empty() &&
      config.progress_cpus.size() != static_cast<size_t>(config.num_domains)) {
    return Status::InvalidArgument(fmt::format("fabric progress_cpus has {} entries for {} domains",
                                               config.progress_cpus.size(), config.num_domains));
  }
  return Status::Ok();
}

}  // namespace pdserve::fabric
