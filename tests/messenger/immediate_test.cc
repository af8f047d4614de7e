#include "messenger/immediate.h"

#include <set>

#include <gtest/gtest.h>

namespace pdserve::messenger {
namespace {

TEST(ImmediateTest, RoundTripsEveryCornerOfTheSplit) {
  for (uint32_t slot : {0u, 1u, 12345u, kMaxTransferSlots - 1}) {
    for (uint32_t generation : {0u, 1u, 77u, kTransferGenerations - 1}) {
      const TransferTag tag{.slot = slot, .generation = generation};
      EXPECT_EQ(DecodeImmediate(EncodeImmediate(tag)), tag) << slot << " " << generation;
    }
  }
  // The documented split: slot in the low 20 bits, generation in the high 12.
  EXPECT_EQ(kImmediateSlotBits, 20);
  EXPECT_EQ(EncodeImmediate({.slot = 0, .generation = 1}), 1u << 20);
  EXPECT_EQ(EncodeImmediate({.slot = 5, .generation = 0}), 5u);
  EXPECT_EQ(DecodeImmediate(0xffffffffu),
            (TransferTag{.slot = kMaxTransferSlots - 1, .generation = kTransferGenerations - 1}));
}

TEST(ImmediateTest, DistinctTagsGiveDistinctImmediates) {
  std::set<uint32_t> seen;
  for (uint32_t slot = 0; slot < 64; ++slot) {
    for (uint32_t generation = 0; generation < 64; ++generation) {
      EXPECT_TRUE(seen.insert(EncodeImmediate({.slot = slot, .generation = generation})).second);
    }
  }
}

TEST(ImmediateTest, ValidityAndGenerationWrap) {
  EXPECT_TRUE(IsValidTransferTag({.slot = kMaxTransferSlots - 1, .generation = 0}));
  EXPECT_FALSE(IsValidTransferTag({.slot = kMaxTransferSlots, .generation = 0}));
  EXPECT_FALSE(IsValidTransferTag({.slot = 0, .generation = kTransferGenerations}));
  EXPECT_EQ(NextGeneration(3), 4u);
  EXPECT_EQ(NextGeneration(kTransferGenerations - 1), 0u);
}

TEST(ImmediateDeathTest, EncodingAnOutOfRangeTagIsAProgrammerError) {
  EXPECT_DEATH((void)EncodeImmediate({.slot = kMaxTransferSlots, .generation = 0}), "check");
}

}  // namespace
}  // namespace pdserve::messenger
