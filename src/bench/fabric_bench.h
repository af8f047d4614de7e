// `pdserve bench fabric`: paged RMA writes with immediates through the TransferEngine beside
// two ceilings measured in the same run (raw fi_writedata through fabric::RawWriteProbe on the
// same provider and sizes, and single-thread memcpy), printed as a markdown table. The
// receiving side runs in a second process that the benchmark starts.
// Call from one thread; the benchmark starts its own threads (TransferEngine, the peer's poller).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "fabric/config.h"

namespace pdserve::bench {

struct FabricBenchOptions {
  fabric::Provider provider = fabric::Provider::kShm;
  std::vector<size_t> page_bytes;  // each in [4 KiB, 1 MiB]; empty: 4K 16K 64K 256K 1M
  uint32_t pages = 64;             // pages per paged write, in [1, 4096]
  uint64_t mib_per_size = 256;     // MiB moved per page size
  // The receiving process: this command line plus "--provider NAME --bytes N" must run
  // RunFabricBenchPeer (pdserve: its hidden `bench fabric-peer` subcommand).
  std::vector<std::string> peer_command;
};

// Runs the benchmark and prints the table to stdout (progress to stderr). InvalidArgument on
// bad options; fabric and peer errors pass through.
Status RunFabricBench(const FabricBenchOptions& options);

// The receiving process's main loop: registers `bytes` of memory with a TransferEngine and a
// RawWriteProbe, prints "ready ..." and answers line commands on stdin until "quit" or EOF.
// Returns the process exit code.
int RunFabricBenchPeer(fabric::Provider provider, uint64_t bytes);

}  // namespace pdserve::bench
