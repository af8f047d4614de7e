// RAII owners for libfabric handles and the libfabric error -> Status mapping.
// A FidPtr closes its object with fi_close exactly once; an InfoPtr frees an fi_info list.
// Plain owners: thread-compatible (use one from one thread at a time). Closing order is the
// owner's job: an endpoint must close before the CQ, AV and MRs bound to it.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <rdma/fabric.h>

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

// Status for a negative libfabric return code `ret` of the call named in `what`.
// -FI_EAGAIN never reaches here: callers retry it.
Status FabricError(std::string_view what, long ret);

}  // namespace pdserve::fabric
