// `pdserve bench fabric`'s page flag is --page-bytes (a size in bytes): --page-size means a page
// in tokens everywhere else, so the fabric bench does not take it. Flags only: nothing is sent.
#include <string>

#include <gtest/gtest.h>

#include "common/clock.h"
#include "testing/processes.h"

namespace pdserve {
namespace {

testing::CommandRun RunBenchFabric(const std::string& flag, const std::string& value) {
  return testing::RunPdserve({"bench", "fabric", "--provider", "tcp", flag, value},
                             Deadline::AfterMs(60'000));
}

TEST(BenchFabricFlagsTest, PageBytesIsASizeInBytesAndPageSizeIsRefused) {
  const testing::CommandRun small = RunBenchFabric("--page-bytes", "16");
  ASSERT_TRUE(small.finished);
  EXPECT_EQ(small.exit.code, 1) << small.output;
  EXPECT_NE(small.output.find("--page-bytes 16 is outside 4K..1M"), std::string::npos)
      << small.output;

  const testing::CommandRun unit = RunBenchFabric("--page-bytes", "16Q");
  ASSERT_TRUE(unit.finished);
  EXPECT_NE(unit.output.find("--page-bytes '16Q' has an unknown unit"), std::string::npos)
      << unit.output;

  const testing::CommandRun tokens = RunBenchFabric("--page-size", "16K");
  ASSERT_TRUE(tokens.finished);
  EXPECT_NE(tokens.exit.code, 0) << tokens.output;
  EXPECT_NE(tokens.output.find("--page-size"), std::string::npos) << tokens.output;
}

}  // namespace
}  // namespace pdserve
