// SlotTable: the decode messenger's transfer slots (DESIGN.md §3.4). A transfer holds a slot
// from its Expect until no write of it can land any more; each write's immediate names the
// slot and the generation of this use (messenger/immediate.h). Releasing a slot moves its
// generation on, so a late write of a finished, abandoned or removed peer's transfer carries a
// (slot, generation) no expectation waits for, and counts for nobody. Free slots are reused
// newest first. Pure bookkeeping; thread-compatible (the decode messenger's control loop).
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "messenger/immediate.h"

namespace pdserve::messenger {

class SlotTable {
 public:
  explicit SlotTable(uint32_t max_slots = kMaxTransferSlots) : max_slots_(max_slots) {}

  // A free slot with its current generation; ResourceExhausted when all are in use.
  Result<TransferTag> Acquire();
  // Precondition: `slot` was acquired and not released since.
  void Release(uint32_t slot);
  int in_use() const { return static_cast<int>(generation_.size() - free_.size()); }

 private:
  const uint32_t max_slots_;
  std::vector<uint32_t> generation_;  // by slot
  std::vector<uint32_t> free_;
};

}  // namespace pdserve::messenger
