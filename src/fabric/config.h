// Configuration of a TransferEngine: provider, domains (NICs), placement and limits.
// Plain value type; thread-compatible.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace pdserve::fabric {

// The libfabric providers the engine is written for. kVerbs and kEfa are selectable code paths
// that cannot be exercised on machines without such NICs (see docs/fabric.md).
enum class Provider : uint8_t { kShm, kTcp, kVerbs, kEfa };

// "shm" | "tcp" | "verbs" | "efa" (case-sensitive); anything else is InvalidArgument.
Result<Provider> ParseProvider(std::string_view name);
std::string_view ProviderName(Provider provider);
// The libfabric provider string given to fi_getinfo, e.g. "tcp;ofi_rxm".
std::string_view LibfabricProviderString(Provider provider);

struct FabricConfig {
  Provider provider = Provider::kShm;
  // Local address the endpoints bind to (tcp: an IPv4/IPv6 address such as "127.0.0.1").
  // Empty: the provider's default interface.
  std::string node;
  // Number of domains, each with one endpoint, CQ and progress thread. Page lists are striped
  // across them. When there are fewer distinct NICs than domains, NICs are opened again.
  int num_domains = 1;
  // Override of the NICs (libfabric domain names, e.g. "mlx5_0", "eth0") to use, in order.
  // Empty: chosen by topology, nearest to memory_numa_node first.
  std::vector<std::string> nics;
  // NUMA node (OS index) of the memory this engine mostly moves; -1: no preference.
  int memory_numa_node = -1;
  // Pin progress threads to CPUs near their NIC (or near memory_numa_node).
  bool pin_progress_threads = true;
  // Override of the CPUs (OS indexes) of each domain's progress thread; entry i for domain i.
  std::vector<std::vector<int>> progress_cpus;
  // Largest control message payload (Send). Each domain posts receive_buffers of this size.
  size_t max_message_bytes = 64 * 1024;
  int receive_buffers = 16;
  // Deadline given to writes and sends that do not carry their own.
  std::chrono::milliseconds default_transfer_timeout{30000};
  // How long a progress thread keeps polling (yielding the CPU between polls) after its last
  // work before it starts sleeping. Longer: lower latency for bursts, more CPU when idle.
  std::chrono::microseconds idle_spin{2000};
  // Longest sleep of an idle progress thread between CQ polls (libfabric progress is manual,
  // so this bounds how late an idle receiver notices an arrival).
  std::chrono::microseconds idle_poll_max{200};
  // Bound on distinct immediate values remembered before any Expect names them.
  size_t max_early_immediate_values = 1 << 16;
};

// InvalidArgument naming the first bad field, or Ok.
Status ValidateConfig(const FabricConfig& config);

}  // namespace pdserve::fabric
