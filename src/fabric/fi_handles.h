// RAII owners for libfabric handles and the libfabric error -> Status mapping.
// A FidPtr closes its object with fi_close exactly once; an InfoPtr frees an fi_info list.
// Plain owners: thread-compatible (use one from one thread at a time). Closing order is the
// owner's job: an endpoint must close before the CQ, AV and MRs bound to it.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include "common/status.h"

namespace pdserve::fabric {

struct FidCloser {
  template <typename T>
  void operator()(T* object) const {
    if (object != nullptr) fi_close(&object->fid);
  }
};
template <typename T>
using FidPtr = std::unique_ptr<T, FidCloser>;

struct InfoDeleter {
  void operator()(fi_info* info) const {
    if (info != nullptr) fi_freeinfo(info);
  }
};
using InfoPtr = std::unique_ptr<fi_info, InfoDeleter>;

// An enabled endpoint and the name peers address it by.
struct EnabledEndpoint {
  FidPtr<fid_ep> ep;
  std::string name;
};

// Opens an endpoint of `info` on `domain`, binds `av` and `cq` (transmit and receive), enables
// it and reads its name. shm names an endpoint's region file after the process id and an
// endpoint counter and refuses one whose file exists with a live owner (-FI_EBUSY): after a
// node is SIGKILLed its file stays in /dev/shm, and a later process that gets the same pid meets
// it (seen in CI). libfabric unlinks such a file when it refuses it, and the next endpoint gets
// the next counter, so a refused endpoint is closed and opened again (a few times at most).
Result<EnabledEndpoint> OpenEnabledEndpoint(fid_domain* domain, fi_info* info, fid_av* av,
                                            fid_cq* cq);

// Status for a negative libfabric return code `ret` of the call named in `what`.
// -FI_EAGAIN never reaches here: callers retry it.
Status FabricError(std::string_view what, long ret);

}  // namespace pdserve::fabric
