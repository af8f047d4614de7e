// KvCache: the storage of the paged KV cache described by a KvLayout. The memory is a
// memfd mapping so that another process (the node's main process, for fabric registration)
// can map the same pages by fd. Reads and writes of distinct blocks may happen from any
// thread; the engine and the transfer engine never touch the same block at the same time
// (the page pool and the messenger ensure it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/status.h"
#include "kv/layout.h"

namespace pdserve {

class KvCache {
 public:
  // Creates a zeroed cache of layout.total_bytes(), followed by `slot_bytes` of context slot per
  // page (ContextSlot). Errors: an invalid layout (KvLayout::Validate, e.g. an F16 dtype), no
  // memory.
  static Result<std::unique_ptr<KvCache>> Create(const KvLayout& layout, size_t slot_bytes = 0);
  // Maps another process's cache (a tensor-parallel rank worker maps the one its node created
  // for it) and takes ownership of `fd`. Errors: an invalid layout, an fd whose size is not the
  // layout's, a failed mmap (fd is closed on a failed mmap; on the other errors it stays the
  // caller's).
  static Result<std::unique_ptr<KvCache>> Map(const KvLayout& layout, int fd);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const KvLayout& layout() const { return layout_; }
  uint8_t* base() { return base_; }
  const uint8_t* base() const { return base_; }
  size_t size_bytes() const { return size_; }
  int fd() const { return fd_; }  // memfd; owned by this object

  // Start of component `c` of one page of a layer: [kv_heads][page_tokens][head_dim].
  uint8_t* Block(int layer, PageId page, KvComponent c) {
    return base_ + layout_.ComponentOffset(layer, page, c);
  }
  const uint8_t* Block(int layer, PageId page, KvComponent c) const {
    return base_ + layout_.ComponentOffset(layer, page, c);
  }
  // The same for a GQA cache's K (is_v false) or V: shorthand for tests that walk both.
  uint8_t* Block(int layer, PageId page, bool is_v) {
    return Block(layer, page, is_v ? KvComponent::kV : KvComponent::kK);
  }
  const uint8_t* Block(int layer, PageId page, bool is_v) const {
    return Block(layer, page, is_v ? KvComponent::kV : KvComponent::kK);
  }

  // A request's context slot (what a drafter starts from, written over the fabric with the
  // pages: docs/messenger.md), named by the page holding the request's last prefilled
  // position, a page it holds alone (never one shared from the prefix cache), so that the slot
  // is the request's alone for as long as it holds that page. After every page of every
  // layer, in the same mapped (and registered) memory. slot_bytes() 0: none.
  size_t slot_bytes() const { return slot_bytes_; }
  uint64_t ContextSlotOffset(PageId page) const {
    return layout_.total_bytes() + static_cast<uint64_t>(page) * slot_bytes_;
  }
  uint8_t* ContextSlot(PageId page) { return base_ + ContextSlotOffset(page); }

 private:
  // Maps `size` bytes of `fd` and owns both; closes fd on failure.
  static Result<std::unique_ptr<KvCache>> MapFd(const KvLayout& layout, int fd, size_t size);
  KvCache(const KvLayout& layout, int fd, uint8_t* base, size_t size)
      : layout_(layout), fd_(fd), base_(base), size_(size) {}
  KvLayout layout_;
  int fd_;
  uint8_t* base_;
  size_t size_;
  size_t slot_bytes_ = 0;
};

}  // namespace pdserve
