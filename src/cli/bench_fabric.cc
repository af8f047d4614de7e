// `pdserve bench fabric`: paged RMA writes with immediates through the TransferEngine, next to
// two ceilings measured in the same run: a raw fi_writedata loop on the same provider and
// sizes, and single-thread memcpy. It starts its own receiving process (this binary again,
// hidden subcommand `bench fabric-peer`) and talks to it over a pipe.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include "cli/commands.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "fabric/fi_handles.h"
#include "fabric/transfer_engine.h"

namespace pdserve::cli {
namespace {

using fabric::FabricError;
using fabric::FidPtr;
using fabric::InfoPtr;

struct BenchFlags {
  std::string provider = "shm";
  std::string page_size;  // empty: the standard sweep
  uint32_t pages = 64;
  uint64_t mib_per_size = 256;
};

// ---------------------------------------------------------------------------------------------
// The raw ceiling: one endpoint driven directly with libfabric, no engine in between.

class RawEndpoint {
 public:
  static Result<std::unique_ptr<RawEndpoint>> Open(fabric::Provider provider, void* buf,
                                                   size_t bytes);
  const std::string& name() const { return name_; }
  uint64_t remote_base() const { return virt_addr_ ? reinterpret_cast<uint64_t>(buf_) : 0; }
  uint64_t key() const { return fi_mr_key(mr_.get()); }
  Result<fi_addr_t> Insert(const std::string& name);
  // Writes `count` times `size` bytes (page i % pages) to the peer, posting until the
  // provider pushes back and reaping completions in between.
  Status WriteLoop(fi_addr_t peer, uint64_t base, uint64_t key, size_t size, uint32_t pages,
                   uint64_t count, uint64_t window, uint32_t imm);
  // Reads the CQ once; returns how many remote-write completions it saw.
  uint64_t PollRemote();
  ~RawEndpoint() {
    ep_.reset();
    mr_.reset();
  }

 private:
  InfoPtr info_;
  FidPtr<fid_fabric> fabric_;
  FidPtr<fid_domain> domain_;
  FidPtr<fid_av> av_;
  FidPtr<fid_cq> cq_;
  FidPtr<fid_mr> mr_;
  FidPtr<fid_ep> ep_;
  std::string name_;
  std::byte* buf_ = nullptr;
  bool virt_addr_ = false;
};

Result<std::unique_ptr<RawEndpoint>> RawEndpoint::Open(fabric::Provider provider, void* buf,
                                                       size_t bytes) {
  auto raw = std::make_unique<RawEndpoint>();
  raw->buf_ = static_cast<std::byte*>(buf);
  InfoPtr hints(fi_allocinfo());
  hints->caps = FI_MSG | FI_RMA;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  hints->domain_attr->cq_data_size = 4;
  hints->fabric_attr->prov_name =
      strdup(std::string(fabric::LibfabricProviderString(provider)).c_str());
  const char* node = provider == fabric::Provider::kTcp ? "127.0.0.1" : nullptr;
  fi_info* info = nullptr;
  long rc = fi_getinfo(FI_VERSION(1, 17), node, nullptr, node ? FI_SOURCE : 0, hints.get(), &info);
  if (rc != 0) return FabricError("fi_getinfo (raw)", rc);
  raw->info_.reset(info);
  raw->virt_addr_ = (info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0;
  fid_fabric* f = nullptr;
  if ((rc = fi_fabric(info->fabric_attr, &f, nullptr)) != 0) return FabricError("fi_fabric", rc);
  raw->fabric_.reset(f);
  fid_domain* d = nullptr;
  if ((rc = fi_domain(f, info, &d, nullptr)) != 0) return FabricError("fi_domain", rc);
  raw->domain_.reset(d);
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  fid_av* av = nullptr;
  if ((rc = fi_av_open(d, &av_attr, &av, nullptr)) != 0) return FabricError("fi_av_open", rc);
  raw->av_.reset(av);
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_DATA;
  cq_attr.size = info->tx_attr->size + info->rx_attr->size;
  fid_cq* cq = nullptr;
  if ((rc = fi_cq_open(d, &cq_attr, &cq, nullptr)) != 0) return FabricError("fi_cq_open", rc);
  raw->cq_.reset(cq);
  fid_mr* mr = nullptr;
  rc = fi_mr_reg(d, buf, bytes, FI_WRITE | FI_REMOTE_WRITE, 0, 1, 0, &mr, nullptr);
  if (rc != 0) return FabricError("fi_mr_reg", rc);
  raw->mr_.reset(mr);
  fid_ep* ep = nullptr;
  if ((rc = fi_endpoint(d, info, &ep, nullptr)) != 0) return FabricError("fi_endpoint", rc);
  raw->ep_.reset(ep);
  if ((rc = fi_ep_bind(ep, &av->fid, 0)) != 0) return FabricError("fi_ep_bind", rc);
  if ((rc = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV)) != 0) {
    return FabricError("fi_ep_bind", rc);
  }
  if ((rc = fi_enable(ep)) != 0) return FabricError("fi_enable", rc);
  char name[1024];
  size_t len = sizeof name;
  if ((rc = fi_getname(&ep->fid, name, &len)) != 0) return FabricError("fi_getname", rc);
  raw->name_.assign(name, len);
  return raw;
}

Result<fi_addr_t> RawEndpoint::Insert(const std::string& name) {
  fi_addr_t addr = FI_ADDR_NOTAVAIL;
  if (fi_av_insert(av_.get(), name.data(), 1, &addr, 0, nullptr) != 1) {
    return Status::Unavailable("raw endpoint: fi_av_insert failed");
  }
  return addr;
}

Status RawEndpoint::WriteLoop(fi_addr_t peer, uint64_t base, uint64_t key, size_t size,
                              uint32_t pages, uint64_t count, uint64_t window, uint32_t imm) {
  void* desc = fi_mr_desc(mr_.get());
  uint64_t posted = 0, done = 0;
  fi_cq_data_entry entries[64];
  const Deadline deadline = Deadline::AfterMs(120000);
  while (done < count) {
    // Same pipelining as the engine gets: at most `window` writes in flight, posted in runs
    // of up to 64 between completion reads (progress is manual).
    for (int burst = 0; posted < count && posted - done < window && burst < 64; ++burst) {
      const uint64_t page = posted % pages;
      ssize_t rc = fi_writedata(ep_.get(), buf_ + page * size, size, desc, imm, peer,
                                base + page * size, key, nullptr);
      if (rc == -FI_EAGAIN) break;
      if (rc != 0) return FabricError("fi_writedata (raw)", rc);
      ++posted;
    }
    ssize_t n = fi_cq_read(cq_.get(), entries, 64);
    if (n > 0) done += static_cast<uint64_t>(n);
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      fi_cq_readerr(cq_.get(), &err, 0);
      return Status::Unavailable(fmt::format("raw write failed: {}", fi_strerror(err.err)));
    }
    if (deadline.Passed()) return Status::DeadlineExceeded("raw write loop did not finish");
  }
  return Status::Ok();
}

uint64_t RawEndpoint::PollRemote() {
  fi_cq_data_entry entries[64];
  ssize_t n = fi_cq_read(cq_.get(), entries, 64);
  if (n <= 0) return 0;
  uint64_t remote = 0;
  for (ssize_t i = 0; i < n; ++i) remote += (entries[i].flags & FI_REMOTE_CQ_DATA) != 0;
  return remote;
}

// ---------------------------------------------------------------------------------------------
// The receiving process.

int RunPeer(const std::string& provider_name, uint64_t bytes) {
  auto provider = fabric::ParseProvider(provider_name);
  if (!provider.ok()) return 2;
  std::vector<std::byte> memory(bytes, std::byte{0});
  fabric::FabricConfig config;
  config.provider = *provider;
  if (*provider == fabric::Provider::kTcp) config.node = "127.0.0.1";
  auto engine = fabric::TransferEngine::Create(config);
  if (!engine.ok()) {
    std::printf("error %s\n", engine.status().ToString().c_str());
    return 1;
  }
  auto region = (*engine)->RegisterMemory(memory.data(), memory.size());
  auto raw = RawEndpoint::Open(*provider, memory.data(), memory.size());
  if (!region.ok() || !raw.ok()) {
    std::printf("error %s %s\n", region.status().ToString().c_str(),
                raw.status().ToString().c_str());
    return 1;
  }
  auto desc = (*engine)->Describe(*region);
  std::printf(
      "ready %s %s %s %llu %llu\n", fabric::HexEncode((*engine)->address().Serialize()).c_str(),
      fabric::HexEncode(desc->Serialize()).c_str(), fabric::HexEncode((*raw)->name()).c_str(),
      static_cast<unsigned long long>((*raw)->remote_base()),
      static_cast<unsigned long long>((*raw)->key()));
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

class Child {
 public:
  Status Start(const std::string& provider, uint64_t bytes) {
    int to[2], from[2];
    if (pipe2(to, O_CLOEXEC) != 0 || pipe2(from, O_CLOEXEC) != 0) {
      return Status::FromErrno("pipe2", errno);
    }
    pid_ = fork();
    if (pid_ < 0) return Status::FromErrno("fork", errno);
    if (pid_ == 0) {
      dup2(to[0], STDIN_FILENO);
      dup2(from[1], STDOUT_FILENO);
      const std::string size = std::to_string(bytes);
      execl("/proc/self/exe", "pdserve", "bench", "fabric-peer", "--provider", provider.c_str(),
            "--bytes", size.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(to[0]);
    close(from[1]);
    to_ = to[1];
    from_ = fdopen(from[0], "r");
    return Status::Ok();
  }
  ~Child() {
    if (to_ >= 0) {
      (void)!write(to_, "quit\n", 5);
      close(to_);
    }
    if (pid_ > 0) {
      // Bounded: give it a moment to close its fabric cleanly, then kill it.
      for (int i = 0; i < 200; ++i) {
        if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
          pid_ = -1;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      if (pid_ > 0) {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
      }
    }
    if (from_ != nullptr) fclose(from_);
  }
  // The child answers every command with one line; it only blocks on bounded waits.
  Result<std::string> Ask(const std::string& command) {
    std::string line = command + "\n";
    if (write(to_, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      return Status::FromErrno("write to bench peer", errno);
    }
    return ReadLine();
  }
  Result<std::string> ReadLine() {
    char buf[8192];
    if (std::fgets(buf, sizeof buf, from_) == nullptr) {
      return Status::Unavailable("bench peer process exited");
    }
    std::string s(buf);
    while (!s.empty() && s.back() == '\n') s.pop_back();
    if (s.rfind("error", 0) == 0) return Status::Internal("bench peer: " + s);
    return s;
  }

 private:
  pid_t pid_ = -1;
  int to_ = -1;
  FILE* from_ = nullptr;
};

constexpr int kRepeats = 3;
constexpr int kWindow = 8;  // paged writes in flight (the raw loop gets as many writes)

struct Row {
  size_t size = 0;
  double engine_gbps = 0, p50_us = 0, p99_us = 0, raw_gbps = 0, memcpy_gbps = 0;
};

double Gbps(uint64_t bytes, double seconds) { return seconds > 0 ? bytes / seconds / 1e9 : 0; }

Result<Row> MeasureEngine(fabric::TransferEngine& engine, fabric::RegionId region,
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
  std::vector<double> latency_us(transfers);
  // What the completion callbacks (progress threads) share with this thread.
  struct Window {
    Mutex mu;
    CondVar cv;
    int inflight GUARDED_BY(mu) = 0;
    uint64_t done GUARDED_BY(mu) = 0;
    Status first_error GUARDED_BY(mu);
  } window;
  const TimePoint start = Clock::now();
  for (uint64_t t = 0; t < transfers; ++t) {
    {
      MutexLock lock(&window.mu);
      const TimePoint deadline = Clock::now() + std::chrono::seconds(60);
      while (window.inflight >= kWindow) {
        if (window.cv.WaitUntil(&window.mu, deadline) == std::cv_status::timeout &&
            window.inflight >= kWindow) {
          return Status::DeadlineExceeded("paged writes stopped completing");
        }
      }
      ++window.inflight;
    }
    const TimePoint posted = Clock::now();
    PD_RETURN_IF_ERROR(engine.PostPagedWrite(
        w, fabric::Completion{[&, t, posted](const Status& s) {
          const double us =
              std::chrono::duration<double, std::micro>(Clock::now() - posted).count();
          MutexLock lock(&window.mu);
          latency_us[t] = us;
          if (!s.ok() && window.first_error.ok()) window.first_error = s;
          --window.inflight;
          ++window.done;
          window.cv.NotifyAll();
        }}));
  }
  MutexLock lock(&window.mu);
  const TimePoint deadline = Clock::now() + std::chrono::seconds(60);
  while (window.done != transfers) {
    if (window.cv.WaitUntil(&window.mu, deadline) == std::cv_status::timeout &&
        window.done != transfers) {
      return Status::DeadlineExceeded("paged writes did not finish");
    }
  }
  const double seconds = SecondsSince(start);
  PD_RETURN_IF_ERROR(window.first_error);
  std::sort(latency_us.begin(), latency_us.end());
  Row row;
  row.engine_gbps = Gbps(transfers * pages * size, seconds);
  row.p50_us = latency_us[transfers / 2];
  row.p99_us = latency_us[std::min<uint64_t>(transfers - 1, transfers * 99 / 100)];
  return row;
}

// Waits until the peer engine has counted `expected` immediates `imm` (all writes landed).
Status WaitLanded(Child& child, uint32_t imm, uint64_t expected) {
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

Result<double> MeasureRaw(Child& child, RawEndpoint& raw, fi_addr_t peer, uint64_t base,
                          uint64_t key, size_t size, uint32_t pages, uint64_t count) {
  PD_RETURN_IF_ERROR(child.Ask("raw-start").status());
  const TimePoint start = Clock::now();
  PD_RETURN_IF_ERROR(raw.WriteLoop(peer, base, key, size, pages, count, kWindow * pages, 1));
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

Result<size_t> ParseSize(const std::string& text) {
  size_t used = 0;
  uint64_t value = 0;
  try {
    value = std::stoull(text, &used);
  } catch (const std::exception&) {
    return Status::InvalidArgument(fmt::format("--page-size '{}' is not a size", text));
  }
  std::string unit = text.substr(used);
  if (unit == "K" || unit == "k" || unit == "KiB") {
    value <<= 10;
  } else if (unit == "M" || unit == "m" || unit == "MiB") {
    value <<= 20;
  } else if (!unit.empty()) {
    return Status::InvalidArgument(fmt::format("--page-size '{}' has an unknown unit", text));
  }
  if (value < 4096 || value > (1u << 20)) {
    return Status::InvalidArgument(fmt::format("--page-size {} is outside 4K..1M", text));
  }
  return static_cast<size_t>(value);
}

void PrintTable(const BenchFlags& flags, const std::vector<Row>& rows) {
  std::printf(
      "\nfabric bench: provider %s, %u pages per paged write, 8 paged writes in flight, "
      "best of %d runs\n",
      flags.provider.c_str(), flags.pages, kRepeats);
  std::printf(
      "| page | engine GB/s | p50 us | p99 us | raw fi_writedata GB/s | engine/raw | "
      "memcpy GB/s | engine/memcpy |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const Row& r : rows) {
    const std::string page =
        r.size >= (1u << 20) ? fmt::format("{}M", r.size >> 20) : fmt::format("{}K", r.size >> 10);
    std::printf("| %s | %.2f | %.0f | %.0f | %.2f | %.0f%% | %.2f | %.0f%% |\n", page.c_str(),
                r.engine_gbps, r.p50_us, r.p99_us, r.raw_gbps, 100 * r.engine_gbps / r.raw_gbps,
                r.memcpy_gbps, 100 * r.engine_gbps / r.memcpy_gbps);
  }
}

Status RunBench(const BenchFlags& flags) {
  PD_ASSIGN_OR_RETURN(fabric::Provider provider, fabric::ParseProvider(flags.provider));
  std::vector<size_t> sizes = {4096, 16384, 65536, 262144, 1u << 20};
  if (!flags.page_size.empty()) {
    PD_ASSIGN_OR_RETURN(size_t size, ParseSize(flags.page_size));
    sizes = {size};
  }
  if (flags.pages < 1 || flags.pages > 4096) {
    return Status::InvalidArgument("--pages must be in [1, 4096]");
  }
  const size_t max_size = *std::max_element(sizes.begin(), sizes.end());
  const uint64_t bytes = static_cast<uint64_t>(max_size) * flags.pages;
  Child child;
  PD_RETURN_IF_ERROR(child.Start(flags.provider, bytes));
  PD_ASSIGN_OR_RETURN(std::string ready, child.ReadLine());
  std::istringstream in(ready);
  std::string word, address_hex, desc_hex, raw_name_hex;
  unsigned long long raw_base = 0, raw_key = 0;
  in >> word >> address_hex >> desc_hex >> raw_name_hex >> raw_base >> raw_key;
  if (word != "ready") return Status::ProtocolError("bench peer did not start: " + ready);
  PD_ASSIGN_OR_RETURN(std::string address_bytes, fabric::HexDecode(address_hex));
  PD_ASSIGN_OR_RETURN(std::string desc_bytes, fabric::HexDecode(desc_hex));
  PD_ASSIGN_OR_RETURN(std::string raw_name, fabric::HexDecode(raw_name_hex));
  PD_ASSIGN_OR_RETURN(fabric::EngineAddress address, fabric::EngineAddress::Parse(address_bytes));
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
  PD_ASSIGN_OR_RETURN(auto raw, RawEndpoint::Open(provider, src.data(), src.size()));
  PD_ASSIGN_OR_RETURN(fi_addr_t raw_peer, raw->Insert(raw_name));

  std::vector<Row> rows;
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
        MeasureRaw(child, *raw, raw_peer, raw_base, raw_key, size, flags.pages, flags.pages)
            .status());
    // Best of kRepeats for each path: this damps noise from other processes on the host.
    Row row;
    for (int rep = 0; rep < kRepeats; ++rep) {
      PD_ASSIGN_OR_RETURN(
          Row run, MeasureEngine(*engine, region, peer, dst, size, flags.pages, transfers, imm));
      PD_RETURN_IF_ERROR(WaitLanded(child, imm++, writes));
      if (run.engine_gbps > row.engine_gbps) row = run;
      PD_ASSIGN_OR_RETURN(double raw_gbps, MeasureRaw(child, *raw, raw_peer, raw_base, raw_key,
                                                      size, flags.pages, writes));
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

}  // namespace

void AddBenchFabricCommand(CLI::App& bench, int* exit_code) {
  auto flags = std::make_shared<BenchFlags>();
  CLI::App* cmd = bench.add_subcommand(
      "fabric", "Paged RMA writes through the transfer engine vs raw fi_writedata and memcpy");
  cmd->add_option("--provider", flags->provider, "Fabric provider: shm or tcp (loopback)")
      ->check(CLI::IsMember({"shm", "tcp", "verbs", "efa"}));
  cmd->add_option("--page-size", flags->page_size,
                  "One page size (4K..1M, e.g. 16K); default: 4K 16K 64K 256K 1M");
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
    *exit_code = RunPeer(*peer_provider, *peer_bytes);
  });
}

}  // namespace pdserve::cli
