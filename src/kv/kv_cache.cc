#include "kv/kv_cache.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>

namespace pdserve {

Result<std::unique_ptr<KvCache>> KvCache::MapFd(const KvLayout& layout, int fd, size_t size) {
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    Status s = Status::FromErrno("mmap(kv cache)", errno);
    close(fd);
    return s;
  }
  return std::unique_ptr<KvCache>(new KvCache(layout, fd, static_cast<uint8_t*>(p), size));
}

Result<std::unique_ptr<KvCache>> KvCache::Create(const KvLayout& layout, size_t slot_bytes) {
  // Validate first: it refuses element types the kernels cannot read (F16) and sizes that overflow.
  PD_RETURN_IF_ERROR(layout.Validate());
  if (slot_bytes > (size_t{1} << 24)) {
    return Status::InvalidArgument(fmt::format("{} bytes of context a page: too many", slot_bytes));
  }
  size_t size = layout.total_bytes() + slot_bytes * static_cast<size_t>(layout.num_pages);
  if (size == 0) return Status::InvalidArgument("KV cache of zero bytes: " + layout.ToString());
  int fd = memfd_create("pdserve-kv", MFD_CLOEXEC);
  if (fd < 0) return Status::FromErrno("memfd_create", errno);
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    Status s = Status::FromErrno("ftruncate(kv cache)", errno);
    close(fd);
    return s;
  }
  PD_ASSIGN_OR_RETURN(auto cache, MapFd(layout, fd, size));
  cache->slot_bytes_ = slot_bytes;
  return cache;
}

Result<std::unique_ptr<KvCache>> KvCache::Map(const KvLayout& layout, int fd) {
  PD_RETURN_IF_ERROR(layout.Validate());
  struct stat st;
  if (fstat(fd, &st) != 0) return Status::FromErrno("fstat(kv cache fd)", errno);
  if (static_cast<uint64_t>(st.st_size) != layout.total_bytes()) {
    return Status::InvalidArgument(
        fmt::format("KV cache fd {} holds {} bytes, the layout {} needs {}", fd, st.st_size,
                    layout.ToString(), layout.total_bytes()));
  }
  return MapFd(layout, fd, layout.total_bytes());
}

KvCache::~KvCache() {
  munmap(base_, size_);
  close(fd_);
}

}  // namespace pdserve
