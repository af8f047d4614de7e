// RawWriteProbe: one libfabric RDM endpoint over a caller's buffer, driven directly with
// fi_writedata and no TransferEngine in between. It measures the provider's own paged-write
// rate, the ceiling `pdserve bench fabric` sets the engine beside; serving code never uses it.
//
// Thread-compatible (FI_THREAD_DOMAIN): one thread at a time per probe; the receiving side may
// poll from a thread of its own as long as nothing else touches that probe meanwhile.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/clock.h"
#include "common/status.h"
#include "fabric/config.h"
#include "fabric/fi_handles.h"

namespace pdserve::fabric {

class RawWriteProbe {
 public:
  // What a writer needs to reach a probe's buffer: its endpoint name, the remote address of
  // byte 0 and the memory key. Exchanged as text by the benchmark.
  struct Target {
    std::string endpoint;
    uint64_t base = 0;
    uint64_t key = 0;
  };
  // Opaque handle of a peer added with AddPeer.
  using PeerAddress = uint64_t;

  // Opens fabric, domain, AV, CQ and endpoint on `provider` (tcp binds 127.0.0.1) and
  // registers [buf, buf + bytes) for remote writes. `buf` must outlive the probe.
  static Result<std::unique_ptr<RawWriteProbe>> Open(Provider provider, void* buf, size_t bytes);
  RawWriteProbe(const RawWriteProbe&) = delete;
  RawWriteProbe& operator=(const RawWriteProbe&) = delete;
  ~RawWriteProbe();

  Target target() const;
  Result<PeerAddress> AddPeer(const std::string& endpoint);
  // Writes `count` times `size` bytes, from page i % pages of this buffer to the same page at
  // `target`, each with immediate `imm`; at most `window` writes in flight, posted in runs of
  // up to 64 between completion reads (progress is manual). Bounded by `deadline`.
  Status WriteLoop(PeerAddress peer, const Target& target, size_t size, uint32_t pages,
                   uint64_t count, uint64_t window, uint32_t imm, Deadline deadline);
  // Reads the CQ once; returns how many remote writes (with immediate) completed here.
  uint64_t PollRemote();

 private:
  RawWriteProbe() = default;
  Status OpenHandles(Provider provider, size_t bytes);

  // Handles, closed in reverse of this order (the endpoint first).
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

}  // namespace pdserve::fabric
