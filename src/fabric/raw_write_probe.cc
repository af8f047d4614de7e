#include "fabric/raw_write_probe.h"

#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <cstring>

#include <fmt/format.h>

namespace pdserve::fabric {

Result<std::unique_ptr<RawWriteProbe>> RawWriteProbe::Open(Provider provider, void* buf,
                                                           size_t bytes) {
  std::unique_ptr<RawWriteProbe> probe(new RawWriteProbe());
  probe->buf_ = static_cast<std::byte*>(buf);
  PD_RETURN_IF_ERROR(probe->OpenHandles(provider, bytes));
  return probe;
}

Status RawWriteProbe::OpenHandles(Provider provider, size_t bytes) {
  InfoPtr hints(fi_allocinfo());
  if (!hints) return Status::ResourceExhausted("fi_allocinfo failed");
  hints->caps = FI_MSG | FI_RMA;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  hints->domain_attr->cq_data_size = 4;
  hints->fabric_attr->prov_name = strdup(std::string(LibfabricProviderString(provider)).c_str());
  const char* node = provider == Provider::kTcp ? "127.0.0.1" : nullptr;
  fi_info* info = nullptr;
  long rc = fi_getinfo(FI_VERSION(1, 17), node, nullptr, node ? FI_SOURCE : 0, hints.get(), &info);
  if (rc != 0) return FabricError("fi_getinfo (raw)", rc);
  info_.reset(info);
  virt_addr_ = (info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0;
  fid_fabric* f = nullptr;
  if ((rc = fi_fabric(info->fabric_attr, &f, nullptr)) != 0) return FabricError("fi_fabric", rc);
  fabric_.reset(f);
  fid_domain* d = nullptr;
  if ((rc = fi_domain(f, info, &d, nullptr)) != 0) return FabricError("fi_domain", rc);
  domain_.reset(d);
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  fid_av* av = nullptr;
  if ((rc = fi_av_open(d, &av_attr, &av, nullptr)) != 0) return FabricError("fi_av_open", rc);
  av_.reset(av);
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_DATA;
  cq_attr.size = info->tx_attr->size + info->rx_attr->size;
  fid_cq* cq = nullptr;
  if ((rc = fi_cq_open(d, &cq_attr, &cq, nullptr)) != 0) return FabricError("fi_cq_open", rc);
  cq_.reset(cq);
  fid_mr* mr = nullptr;
  rc = fi_mr_reg(d, buf_, bytes, FI_WRITE | FI_REMOTE_WRITE, 0, 1, 0, &mr, nullptr);
  if (rc != 0) return FabricError("fi_mr_reg", rc);
  mr_.reset(mr);
  PD_ASSIGN_OR_RETURN(EnabledEndpoint endpoint, OpenEnabledEndpoint(d, info, av, cq));
  ep_ = std::move(endpoint.ep);
  name_ = std::move(endpoint.name);
  return Status::Ok();
}

RawWriteProbe::~RawWriteProbe() {
  // The endpoint closes before the MR and CQ bound to it; the rest in reverse member order.
  ep_.reset();
  mr_.reset();
}

RawWriteProbe::Target RawWriteProbe::target() const {
  return Target{.endpoint = name_,
                .base = virt_addr_ ? reinterpret_cast<uint64_t>(buf_) : 0,
                .key = fi_mr_key(mr_.get())};
}

Result<RawWriteProbe::PeerAddress> RawWriteProbe::AddPeer(const std::string& endpoint) {
  if (endpoint.empty()) return Status::InvalidArgument("raw endpoint: empty peer name");
  fi_addr_t addr = FI_ADDR_NOTAVAIL;
  if (fi_av_insert(av_.get(), endpoint.data(), 1, &addr, 0, nullptr) != 1) {
    return Status::Unavailable("raw endpoint: fi_av_insert failed");
  }
  return addr;
}

Status RawWriteProbe::WriteLoop(PeerAddress peer, const Target& target, size_t size, uint32_t pages,
                                uint64_t count, uint64_t window, uint32_t imm, Deadline deadline) {
  if (pages == 0 || window == 0) return Status::InvalidArgument("raw write loop: no pages");
  void* desc = fi_mr_desc(mr_.get());
  uint64_t posted = 0, done = 0;
  fi_cq_data_entry entries[64];
  while (done < count) {
    for (int burst = 0; posted < count && posted - done < window && burst < 64; ++burst) {
      const uint64_t page = posted % pages;
      ssize_t rc = fi_writedata(ep_.get(), buf_ + page * size, size, desc, imm, peer,
                                target.base + page * size, target.key, nullptr);
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

uint64_t RawWriteProbe::PollRemote() {
  fi_cq_data_entry entries[64];
  ssize_t n = fi_cq_read(cq_.get(), entries, 64);
  if (n <= 0) return 0;
  uint64_t remote = 0;
  for (ssize_t i = 0; i < n; ++i) remote += (entries[i].flags & FI_REMOTE_CQ_DATA) != 0;
  return remote;
}

}  // namespace pdserve::fabric
