// How `pdserve bench fabric` measures (see fabric_bench.h): paged RMA writes with immediates
// through the TransferEngine, next to two ceilings measured in the same run: a raw
// fi_writedata loop on the same provider and sizes (fabric::RawWriteProbe), and single-thread
// memcpy. It starts its own receiving process and talks to it over a pipe.
#include "bench/fabric_bench.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/subprocess.h"
#include "fabric/raw_write_probe.h"
#include "fabric/transfer_engine.h"

namespace pdserve::bench {

// ---------------------------------------------------------------------------------------------
// The receiving process.

int RunFabricBenchPeer(fabric::Provider provider, uint64_t bytes) {
  std::vector<std::byte> memory(bytes, std::byte{0});
  fabric::FabricConfig config;
  config.provider = provider;
  if (provider == fabric::Provider::kTcp) config.node = "127.0.0.1";
  auto engine = fabric::TransferEngine::Create(config);
  if (!engine.ok()) {
    std::printf("error %s\n", engine.status().ToString().c_str());
    return 1;
  }
  auto region = (*engine)->RegisterMemory(memory.data(), memory.size());
  auto raw = fabric::RawWriteProbe::Open(provider, memory.data(), memory.size());
  if (!region.ok() || !raw.ok()) {
    std::printf("error %s %s\n", region.status().ToString().c_str(),
                raw.status().ToString().c_str());
    return 1;
  }
  auto desc = (*engine)->Describe(*region);
  const fabric::RawWriteProbe::Target raw_target = (*raw)->target();
  std::printf(
      "ready %s %s %s %llu %llu\n", fabric::HexEncode((*engine)->address().Serialize()).c_str(),
      fabric::HexEncode(desc->Serialize()).c_str(), fabric::HexEncode(raw_target.endpoint).c_str(),
      static_cast<unsigned long long>(raw_target.base),
      static_cast<unsigned long long>(raw_target.key));
  std::fflush(stdout);
  std::atomic<bool> polling{false};
  std::atomic<uint64_t> raw_arrivals{0};
  std::thread poller;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string command;
    in >> command;
    if (command == "count") {
      uint32_t imm = 0;
      in >> imm;
      std::printf("ok %u\n", (*engine)->EarlyArrivals(imm));
    } else if (command == "raw-start") {
      raw_arrivals = 0;
      polling = true;
      // Manual progress: the receiver must poll for the provider to move data.
      poller = std::thread([&] {
        while (polling.load(std::memory_order_relaxed)) {
          uint64_t n = (*raw)->PollRemote();
          if (n == 0) {
            sched_yield();
          } else {
            raw_arrivals += n;
          }
        }
      });
      std::printf("ok\n");
    } else if (command == "raw-stop") {
      uint64_t expected = 0;
      in >> expected;
      const Deadline deadline = Deadline::AfterMs(60000);
      while (raw_arrivals.load() < expected && !deadline.Passed()) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      polling = false;
      if (poller.joinable()) poller.join();
      std::printf("ok %llu\n", static_cast<unsigned long long>(raw_arrivals.load()));
    } else if (command == "quit") {
      break;
    } else {
      std::printf("error unknown command\n");
    }
    std::fflush(stdout);
  }
  polling = false;
  if (poller.joinable()) poller.join();
  return 0;
}

// ---------------------------------------------------------------------------------------------
// The sending side: the child process, the three measurements and the table.

namespace {

// The receiving process, driven by one-line commands over its stdin and stdout.
class ReceiverProcess {
 public:
  Status Start(const std::vector<std::string>& command, fabric::Provider provider, uint64_t bytes) {
    SubprocessOptions options;
    options.argv = command;
    options.argv.insert(options.argv.end(),
                        {"--provider", std::string(fabric::ProviderName(provider)), "--bytes",
                         std::to_string(bytes)});
    options.stdin_mode = StdStream::kPipe;
    options.stdout_mode = StdStream::kPipe;
    PD_ASSIGN_OR_RETURN(Subprocess process, Subprocess::Spawn(options));
    process_ = std::move(process);
    return Status::Ok();
  }
  ~ReceiverProcess() {
    if (!process_) return;
    // Bounded: give it a moment to close its fabric cleanly; Subprocess kills it after.
    (void)process_->WriteStdin("quit\n", Deadline::AfterMs(1000));
    process_->CloseStdin();
    (void)process_->WaitFor(Deadline::AfterMs(2000));
  }
  // The child answers every command with one line; it only blocks on bounded waits (60 s).
  Result<std::string> Ask(const std::string& command) {
    PD_RETURN_IF_ERROR(process_->WriteStdin(command + "\n", Deadline::AfterMs(10000)));
    return ReadLine();
  }
  Result<std::string> ReadLine() {
    auto line = process_->ReadLine(Deadline::AfterMs(120000));
    if (!line.ok()) return Status::Unavailable("bench peer: " + line.status().ToString());
    if (line->rfind("error", 0) == 0) return Status::Internal("bench peer: " + *line);
    return line;
  }

 private:
  std::optional<Subprocess> process_;
};

constexpr int kRepeats = 3;
constexpr int kWindow = 8;  // paged writes in flight (the raw loop gets as many writes)

// One message size's figures: a row of the table.
struct SizeRow {
  size_t size = 0;
  double engine_gbps = 0, p50_us = 0, p99_us = 0, raw_gbps = 0, memcpy_gbps = 0;
};

double Gbps(uint64_t bytes, double seconds) { return seconds > 0 ? bytes / seconds / 1e9 : 0; }

// The paged writes of one measurement: at most kWindow in flight, each one's latency, the first
// error. Posted from the measuring thread, completed on the engine's progress thread; shared
// with the completions, so one that lands after a timed-out measurement touches live memory.
class WriteWindow {
 public:
  explicit WriteWindow(uint64_t transfers) : latency_us_(transfers) {}

  // Waits for a free slot in the window and takes it; false if none freed before `deadline`.
  bool Enter(TimePoint deadline) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    while (inflight_ >= kWindow) {
      if (cv_.WaitUntil(&mu_, deadline) == std::cv_status::timeout && inflight_ >= kWindow) {
        return false;
      }
    }
    ++inflight_;
    return true;
  }

  // Write `t` completed after `us` microseconds with `status`.
  void Complete(uint64_t t, double us, const Status& status) EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      latency_us_[t] = us;
      if (!status.ok() && first_error_.ok()) first_error_ = status;
      --inflight_;
      ++done_;
    }
    cv_.NotifyAll();
  }

  // Waits until `transfers` writes completed; then the first error, or every write's latency.
  Result<std::vector<double>> Finish(uint64_t transfers, TimePoint deadline) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    while (done_ < transfers) {
      if (cv_.WaitUntil(&mu_, deadline) == std::cv_status::timeout && done_ < transfers) {
        return Status::DeadlineExceeded("paged writes did not finish");
      }
    }
    PD_RETURN_IF_ERROR(first_error_);
    return latency_us_;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  int inflight_ GUARDED_BY(mu_) = 0;
  uint64_t done_ GUARDED_BY(mu_) = 0;
  std::vector<double> latency_us_ GUARDED_BY(mu_);
  Status first_error_ GUARDED_BY(mu_);
};

Result<SizeRow> MeasureEngine(fabric::TransferEngine& engine, fabric::RegionId region,
                              fabric::PeerId peer, const fabric::MemoryDescriptor& dst, size_t size,
                              uint32_t pages, uint64_t transfers, uint32_t imm) {
  std::vector<uint32_t> list(pages);
  for (uint32_t i = 0; i < pages; ++i) list[i] = i;
  fabric::PagedWrite w;
  w.src_region = region;
  w.src_stride = size;
  w.src_pages = list;
  w.peer = peer;
  w.dst = &dst;
  w.dst_stride = size;
  w.dst_pages = list;
  w.length = size;
  w.immediate = imm;
  auto window = std::make_shared<WriteWindow>(transfers);
  constexpr auto kStallLimit = std::chrono::seconds(60);
  const TimePoint start = Clock::now();
  for (uint64_t t = 0; t < transfers; ++t) {
    if (!window->Enter(Clock::now() + kStallLimit)) {
      return Status::DeadlineExceeded("paged writes stopped completing");
    }
    const TimePoint posted = Clock::now();
    PD_RETURN_IF_ERROR(engine.PostPagedWrite(
        w, fabric::Completion{[window, t, posted](const Status& s) {
          window->Complete(
              t, std::chrono::duration<double, std::micro>(Clock::now() - posted).count(), s);
        }}));
  }
  PD_ASSIGN_OR_RETURN(std::vector<double> latency_us,
                      window->Finish(transfers, Clock::now() + kStallLimit));
  const double seconds = SecondsSince(start);
  std::sort(latency_us.begin(), latency_us.end());
  SizeRow row;
  row.engine_gbps = Gbps(transfers * pages * size, seconds);
  row.p50_us = latency_us[transfers / 2];
  row.p99_us = latency_us[std::min<uint64_t>(transfers - 1, transfers * 99 / 100)];
  return row;
}

// Waits until the peer engine has counted `expected` immediates `imm` (all writes landed).
Status WaitLanded(ReceiverProcess& child, uint32_t imm, uint64_t expected) {
  const Deadline deadline = Deadline::AfterMs(60000);
  while (true) {
    PD_ASSIGN_OR_RETURN(std::string reply, child.Ask(fmt::format("count {}", imm)));
    if (reply == fmt::format("ok {}", expected)) return Status::Ok();
    if (deadline.Passed()) {
      return Status::DataLoss(fmt::format("receiver counted '{}', expected {}", reply, expected));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

Result<double> MeasureRaw(ReceiverProcess& child, fabric::RawWriteProbe& raw,
                          fabric::RawWriteProbe::PeerAddress peer,
                          const fabric::RawWriteProbe::Target& target, size_t size, uint32_t pages,
                          uint64_t count) {
  PD_RETURN_IF_ERROR(child.Ask("raw-start").status());
  const TimePoint start = Clock::now();
  // The same pipelining as the engine gets: kWindow paged writes' worth in flight.
  PD_RETURN_IF_ERROR(raw.WriteLoop(peer, target, size, pages, count, kWindow * pages, 1,
                                   Deadline::AfterMs(120000)));
  const double seconds = SecondsSince(start);
  PD_ASSIGN_OR_RETURN(std::string reply, child.Ask(fmt::format("raw-stop {}", count)));
  if (reply != fmt::format("ok {}", count)) {
    return Status::DataLoss(fmt::format("raw receiver counted '{}', expected {}", reply, count));
  }
  return Gbps(count * size, seconds);
}

double MeasureMemcpy(std::byte* src, std::byte* dst, size_t size, uint32_t pages, uint64_t count) {
  const TimePoint start = Clock::now();
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t page = i % pages;
    std::memcpy(dst + page * size, src + page * size, size);
  }
  const double seconds = SecondsSince(start);
  // Keep the copies observable so the loop is not optimised away.
  volatile std::byte sink = dst[(count - 1) % pages * size];
  (void)sink;
  return Gbps(count * size, seconds);
}

void PrintTable(const FabricBenchOptions& flags, const std::vector<SizeRow>& rows) {
  std::printf(
      "\nfabric bench: provider %s, %u pages per paged write, 8 paged writes in flight, "
      "best of %d runs\n",
      std::string(fabric::ProviderName(flags.provider)).c_str(), flags.pages, kRepeats);
  std::printf(
      "| page | engine GB/s | p50 us | p99 us | raw fi_writedata GB/s | engine/raw | "
      "memcpy GB/s | engine/memcpy |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const SizeRow& r : rows) {
    const std::string page =
        r.size >= (1u << 20) ? fmt::format("{}M", r.size >> 20) : fmt::format("{}K", r.size >> 10);
    std::printf("| %s | %.2f | %.0f | %.0f | %.2f | %.0f%% | %.2f | %.0f%% |\n", page.c_str(),
                r.engine_gbps, r.p50_us, r.p99_us, r.raw_gbps, 100 * r.engine_gbps / r.raw_gbps,
                r.memcpy_gbps, 100 * r.engine_gbps / r.memcpy_gbps);
  }
}

}  // namespace

Status RunFabricBench(const FabricBenchOptions& flags) {
  const fabric::Provider provider = flags.provider;
  std::vector<size_t> sizes = flags.page_bytes;
  if (sizes.empty()) sizes = {4096, 16384, 65536, 262144, 1u << 20};
  for (size_t size : sizes) {
    if (size < 4096 || size > (1u << 20)) {
      return Status::InvalidArgument(fmt::format("page size {} is outside 4K..1M", size));
    }
  }
  if (flags.peer_command.empty()) return Status::InvalidArgument("no peer command");
  if (flags.pages < 1 || flags.pages > 4096) {
    return Status::InvalidArgument("--pages must be in [1, 4096]");
  }
  const size_t max_size = *std::max_element(sizes.begin(), sizes.end());
  const uint64_t bytes = static_cast<uint64_t>(max_size) * flags.pages;
  ReceiverProcess child;
  PD_RETURN_IF_ERROR(child.Start(flags.peer_command, provider, bytes));
  PD_ASSIGN_OR_RETURN(std::string ready, child.ReadLine());
  std::istringstream in(ready);
  std::string word, address_hex, desc_hex, raw_name_hex;
  unsigned long long raw_base = 0, raw_key = 0;
  in >> word >> address_hex >> desc_hex >> raw_name_hex >> raw_base >> raw_key;
  if (word != "ready") return Status::ProtocolError("bench peer did not start: " + ready);
  PD_ASSIGN_OR_RETURN(std::string address_bytes, fabric::HexDecode(address_hex));
  PD_ASSIGN_OR_RETURN(std::string desc_bytes, fabric::HexDecode(desc_hex));
  PD_ASSIGN_OR_RETURN(std::string raw_name, fabric::HexDecode(raw_name_hex));
  PD_ASSIGN_OR_RETURN(fabric::TransferEngineAddress address,
                      fabric::TransferEngineAddress::Parse(address_bytes));
  PD_ASSIGN_OR_RETURN(fabric::MemoryDescriptor dst, fabric::MemoryDescriptor::Parse(desc_bytes));

  std::vector<std::byte> src(bytes), copy_dst(bytes);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 131 + 17);
  std::memset(copy_dst.data(), 0, copy_dst.size());
  fabric::FabricConfig config;
  config.provider = provider;
  if (provider == fabric::Provider::kTcp) config.node = "127.0.0.1";
  PD_ASSIGN_OR_RETURN(auto engine, fabric::TransferEngine::Create(config));
  PD_ASSIGN_OR_RETURN(fabric::RegionId region, engine->RegisterMemory(src.data(), src.size()));
  PD_ASSIGN_OR_RETURN(fabric::PeerId peer, engine->AddPeer(address));
  PD_ASSIGN_OR_RETURN(auto raw, fabric::RawWriteProbe::Open(provider, src.data(), src.size()));
  PD_ASSIGN_OR_RETURN(fabric::RawWriteProbe::PeerAddress raw_peer, raw->AddPeer(raw_name));
  const fabric::RawWriteProbe::Target raw_target{
      .endpoint = raw_name, .base = raw_base, .key = raw_key};

  std::vector<SizeRow> rows;
  uint32_t imm = 100;
  for (size_t size : sizes) {
    const uint64_t total = flags.mib_per_size << 20;
    const uint64_t transfers = std::max<uint64_t>(16, total / (size * flags.pages));
    const uint64_t writes = transfers * flags.pages;
    std::fprintf(stderr, "fabric bench: %zu-byte pages, %llu paged writes of %u pages...\n", size,
                 static_cast<unsigned long long>(transfers), flags.pages);
    // Warm-up pass over every page on both paths (first touches fault pages in).
    PD_RETURN_IF_ERROR(
        MeasureEngine(*engine, region, peer, dst, size, flags.pages, 2, imm).status());
    PD_RETURN_IF_ERROR(WaitLanded(child, imm++, 2ull * flags.pages));
    PD_RETURN_IF_ERROR(
        MeasureRaw(child, *raw, raw_peer, raw_target, size, flags.pages, flags.pages).status());
    // Best of kRepeats for each path: this damps noise from other processes on the host.
    SizeRow row;
    for (int rep = 0; rep < kRepeats; ++rep) {
      PD_ASSIGN_OR_RETURN(SizeRow run, MeasureEngine(*engine, region, peer, dst, size, flags.pages,
                                                     transfers, imm));
      PD_RETURN_IF_ERROR(WaitLanded(child, imm++, writes));
      if (run.engine_gbps > row.engine_gbps) row = run;
      PD_ASSIGN_OR_RETURN(double raw_gbps,
                          MeasureRaw(child, *raw, raw_peer, raw_target, size, flags.pages, writes));
      row.raw_gbps = std::max(row.raw_gbps, raw_gbps);
    }
    for (int rep = 0; rep < kRepeats; ++rep) {
      row.memcpy_gbps = std::max(
          row.memcpy_gbps, MeasureMemcpy(src.data(), copy_dst.data(), size, flags.pages, writes));
    }
    row.size = size;
    rows.push_back(row);
  }
  PrintTable(flags, rows);
  return Status::Ok();
}

}  // namespace pdserve::bench
