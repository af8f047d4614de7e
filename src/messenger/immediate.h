// The 32-bit immediate data every KV write carries (DESIGN.md §3.4): which transfer slot of
// the decode node the write counts for, and the slot's generation.
//
// Split: bits 0..19 the slot, bits 20..31 the generation. 2^20 slots bound the requests one
// decode node can have in flight from all its prefill peers; 2^12 generations let a slot be
// reused 4095 times before an immediate can repeat. The generation is defence in depth: a slot
// is reused only once no write of its previous use can land (pins, Cancel acknowledgement),
// and a stray late write of an older use then counts for nobody instead of for the new request.
// Pure functions; safe from any thread.
#pragma once

#include <cstdint>

#include "common/check.h"

namespace pdserve::messenger {

inline constexpr int kImmediateSlotBits = 20;
inline constexpr int kImmediateGenerationBits = 32 - kImmediateSlotBits;
inline constexpr uint32_t kMaxTransferSlots = uint32_t{1} << kImmediateSlotBits;
inline constexpr uint32_t kTransferGenerations = uint32_t{1} << kImmediateGenerationBits;

struct TransferTag {
  uint32_t slot = 0;
  uint32_t generation = 0;
  friend bool operator==(const TransferTag&, const TransferTag&) = default;
};

inline bool IsValidTransferTag(TransferTag tag) {
  return tag.slot < kMaxTransferSlots && tag.generation < kTransferGenerations;
}

// Precondition: IsValidTransferTag(tag) (tags from outside are checked when decoded).
inline uint32_t EncodeImmediate(TransferTag tag) {
  PD_CHECK(IsValidTransferTag(tag));
  return (tag.generation << kImmediateSlotBits) | tag.slot;
}

// Every 32-bit value is some tag: arrivals need no validation, only matching.
inline TransferTag DecodeImmediate(uint32_t imm) {
  return TransferTag{.slot = imm & (kMaxTransferSlots - 1),
                     .generation = imm >> kImmediateSlotBits};
}

// The generation a slot takes on its next use (wraps).
inline uint32_t NextGeneration(uint32_t generation) {
  return (generation + 1) % kTransferGenerations;
}

}  // namespace pdserve::messenger
