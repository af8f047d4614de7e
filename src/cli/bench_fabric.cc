// `pdserve bench fabric` and its hidden receiving process `bench fabric-peer`: their flags; the
// benchmark itself is bench/fabric_bench.h.
#include <cstdio>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "bench/fabric_bench.h"
#include "cli/commands.h"

namespace pdserve::cli {
namespace {

struct BenchFlags {
  std::string provider = "shm";
  std::string page_bytes;  // empty: the standard sweep
  uint32_t pages = 64;
  uint64_t mib_per_size = 256;
};

// "16K", "1M", "65536": a page size in bytes, 4K..1M.
Result<size_t> ParseSize(const std::string& text) {
  size_t used = 0;
  uint64_t value = 0;
  try {
    value = std::stoull(text, &used);
  } catch (const std::exception&) {
    return Status::InvalidArgument(fmt::format("--page-bytes '{}' is not a size", text));
  }
  std::string unit = text.substr(used);
  if (unit == "K" || unit == "k" || unit == "KiB") {
    value <<= 10;
  } else if (unit == "M" || unit == "m" || unit == "MiB") {
    value <<= 20;
  } else if (!unit.empty()) {
    return Status::InvalidArgument(fmt::format("--page-bytes '{}' has an unknown unit", text));
  }
  if (value < 4096 || value > (1u << 20)) {
    return Status::InvalidArgument(fmt::format("--page-bytes {} is outside 4K..1M", text));
  }
  return static_cast<size_t>(value);
}

Status RunBench(const BenchFlags& flags) {
  bench::FabricBenchOptions options;
  PD_ASSIGN_OR_RETURN(options.provider, fabric::ParseProvider(flags.provider));
  if (!flags.page_bytes.empty()) {
    PD_ASSIGN_OR_RETURN(size_t bytes, ParseSize(flags.page_bytes));
    options.page_bytes = {bytes};
  }
  if (flags.pages < 1 || flags.pages > 4096) {
    return Status::InvalidArgument("--pages must be in [1, 4096]");
  }
  options.pages = flags.pages;
  options.mib_per_size = flags.mib_per_size;
  options.peer_command = {"/proc/self/exe", "bench", "fabric-peer"};
  return bench::RunFabricBench(options);
}

}  // namespace

void AddBenchFabricCommand(CLI::App& bench, int* exit_code) {
  auto flags = std::make_shared<BenchFlags>();
  CLI::App* cmd = bench.add_subcommand(
      "fabric", "Paged RMA writes through the transfer engine vs raw fi_writedata and memcpy");
  cmd->add_option("--provider", flags->provider, "Fabric provider: shm or tcp (loopback)")
      ->check(CLI::IsMember({"shm", "tcp", "verbs", "efa"}));
  // Bytes, not tokens: --page-size is every other command's page in tokens.
  cmd->add_option("--page-bytes", flags->page_bytes,
                  "One page size in bytes (4K..1M, e.g. 16K); default: 4K 16K 64K 256K 1M");
  cmd->add_option("--pages", flags->pages, "Pages per paged write (default 64)");
  cmd->add_option("--mib-per-size", flags->mib_per_size, "MiB moved per page size (default 256)");
  cmd->callback([flags, exit_code] {
    Status s = RunBench(*flags);
    if (!s.ok()) {
      std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
      *exit_code = 1;
    }
  });

  // The receiving process of the bench; started by `bench fabric`, hidden from help.
  auto peer_provider = std::make_shared<std::string>();
  auto peer_bytes = std::make_shared<uint64_t>(0);
  CLI::App* peer = bench.add_subcommand("fabric-peer", "Receiver process of bench fabric");
  peer->group("");
  peer->add_option("--provider", *peer_provider)->required();
  peer->add_option("--bytes", *peer_bytes)->required();
  peer->callback([peer_provider, peer_bytes, exit_code] {
    auto provider = fabric::ParseProvider(*peer_provider);
    *exit_code = provider.ok() ? bench::RunFabricBenchPeer(*provider, *peer_bytes) : 2;
  });
}

}  // namespace pdserve::cli
