#include "common/revocable_mapping.h"

#include <sys/mman.h>

#include <cerrno>
#include <utility>

namespace pdserve {

Result<RevocableMapping> RevocableMapping::Map(int fd, size_t length) {
  if (length == 0) return Status::InvalidArgument("a mapping of zero bytes");
  void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return Status::FromErrno("mmap(revocable view)", errno);
  return RevocableMapping(static_cast<std::byte*>(p), length);
}

RevocableMapping::RevocableMapping(RevocableMapping&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      length_(std::exchange(other.length_, 0)),
      revoked_(std::exchange(other.revoked_, false)) {}

RevocableMapping& RevocableMapping::operator=(RevocableMapping&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    length_ = std::exchange(other.length_, 0);
    revoked_ = std::exchange(other.revoked_, false);
  }
  return *this;
}

RevocableMapping::~RevocableMapping() { Reset(); }

void RevocableMapping::Reset() {
  if (data_ != nullptr) munmap(data_, length_);
  data_ = nullptr;
  length_ = 0;
}

Status RevocableMapping::Revoke() {
  if (revoked_ || data_ == nullptr) return Status::Ok();
  // MAP_FIXED swaps the mapping atomically (and flushes the TLBs): a write after this returns
  // faults in a fresh anonymous page instead of reaching the file's.
  void* p = mmap(data_, length_, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return Status::FromErrno("mmap(revoking a view)", errno);
  revoked_ = true;
  return Status::Ok();
}

}  // namespace pdserve
