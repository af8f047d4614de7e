// RevocableMapping: a second mapping of a shareable file (a memfd) that can be revoked. Revoke()
// replaces it, in one mmap, by private throwaway memory of the same size at the same address:
// from then on a write through the old address — one another thread or the kernel is in the
// middle of, e.g. a tcp receive of a remote write's payload — lands in the throwaway memory,
// never in the file's pages. Used to give a remote writer a view of memory that can be taken
// from it whatever its transport still has in flight (docs/messenger.md).
//
// The throwaway memory stays mapped (readable and writable, so that a late memcpy does not
// fault) until the object is destroyed: destroy it only once nothing can write through it any
// more (e.g. after the fabric engine that was given the address is gone). It costs address
// space and only the pages late writes touch.
//
// Thread-compatible: one owner calls Revoke and the destructor; any thread may write through
// data() meanwhile.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"

namespace pdserve {

class RevocableMapping {
 public:
  // Maps [0, length) of `fd` shared, read-write. `fd` stays the caller's.
  static Result<RevocableMapping> Map(int fd, size_t length);
  RevocableMapping() = default;
  RevocableMapping(RevocableMapping&& other) noexcept;
  RevocableMapping& operator=(RevocableMapping&& other) noexcept;
  RevocableMapping(const RevocableMapping&) = delete;
  RevocableMapping& operator=(const RevocableMapping&) = delete;
  ~RevocableMapping();

  std::byte* data() const { return data_; }
  size_t size() const { return length_; }
  bool revoked() const { return revoked_; }
  // After this returns, no write through [data(), data() + size()) reaches the file. Idempotent.
  Status Revoke();

 private:
  RevocableMapping(std::byte* data, size_t length) : data_(data), length_(length) {}
  void Reset();
  std::byte* data_ = nullptr;
  size_t length_ = 0;
  bool revoked_ = false;
};

}  // namespace pdserve
