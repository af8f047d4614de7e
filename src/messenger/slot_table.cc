#include "messenger/slot_table.h"

#include "common/check.h"

namespace pdserve::messenger {

Result<TransferTag> SlotTable::Acquire() {
  if (free_.empty()) {
    const uint32_t slot = static_cast<uint32_t>(generation_.size());
    if (slot >= max_slots_) return Status::ResourceExhausted("no free transfer slot");
    generation_.push_back(0);
    free_.push_back(slot);
  }
  const uint32_t slot = free_.back();
  free_.pop_back();
  return TransferTag{.slot = slot, .generation = generation_[slot]};
}

void SlotTable::Release(uint32_t slot) {
  PD_CHECK(slot < generation_.size());
  generation_[slot] = NextGeneration(generation_[slot]);
  free_.push_back(slot);
}

}  // namespace pdserve::messenger
