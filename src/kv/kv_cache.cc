#include "kv/kv_cache.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

namespace pdserve {

Result<std::unique_ptr<KvCache>> KvCache::Create(const KvLayout& layout) {
  // Validate first: it refuses element types the kernels cannot read (F16) and sizes that overflow.
  PD_RETURN_IF_ERROR(layout.Validate());
  size_t size = layout.total_bytes();
  if (size == 0) return Status::InvalidArgument("KV cache of zero bytes: " + layout.ToString());
  int fd = memfd_create("pdserve-kv", MFD_CLOEXEC);
  if (fd < 0) return Status::FromErrno("memfd_create", errno);
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    Status s = Status::FromErrno("ftruncate(kv cache)", errno);
    close(fd);
    return s;
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    Status s = Status::FromErrno("mmap(kv cache)", errno);
    close(fd);
    return s;
  }
  return std::unique_ptr<KvCache>(new KvCache(layout, fd, static_cast<uint8_t*>(p), size));
}

KvCache::~KvCache() {
  munmap(base_, size_);
  close(fd_);
}

}  // namespace pdserve
