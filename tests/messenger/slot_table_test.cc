#include "messenger/slot_table.h"

#include <gtest/gtest.h>

namespace pdserve::messenger {
namespace {

TEST(SlotTableTest, AReleasedSlotComesBackWithTheNextGeneration) {
  SlotTable slots;
  auto a = slots.Acquire();
  auto b = slots.Acquire();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->slot, b->slot);
  EXPECT_EQ(a->generation, 0u);
  EXPECT_EQ(slots.in_use(), 2);
  slots.Release(a->slot);
  EXPECT_EQ(slots.in_use(), 1);
  auto again = slots.Acquire();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->slot, a->slot);  // reused, newest free first
  EXPECT_EQ(again->generation, NextGeneration(a->generation));
  // So a late write of the first use never matches the second use's immediate.
  EXPECT_NE(EncodeImmediate(*a), EncodeImmediate(*again));
}

TEST(SlotTableTest, ExhaustedWhenEverySlotIsInUse) {
  SlotTable slots(/*max_slots=*/2);
  auto a = slots.Acquire();
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(slots.Acquire().ok());
  EXPECT_EQ(slots.Acquire().status().code(), StatusCode::kResourceExhausted);
  slots.Release(a->slot);
  EXPECT_TRUE(slots.Acquire().ok());
}

TEST(SlotTableTest, GenerationsWrapWithoutEverRepeatingTheLastUse) {
  SlotTable slots(/*max_slots=*/1);
  uint32_t previous = 0;
  for (uint32_t use = 0; use < kTransferGenerations + 3; ++use) {
    auto tag = slots.Acquire();
    ASSERT_TRUE(tag.ok());
    ASSERT_TRUE(IsValidTransferTag(*tag));
    if (use > 0) {
      ASSERT_NE(tag->generation, previous);
    }
    previous = tag->generation;
    slots.Release(tag->slot);
  }
}

}  // namespace
}  // namespace pdserve::messenger
