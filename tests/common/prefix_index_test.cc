#include "common/prefix_index.h"

#include <string>

#include <gtest/gtest.h>

namespace pdserve {
namespace {

TEST(PrefixIndexTest, ChainedHashesNameWholePrefixes) {
  const std::string a = "0123456789abcdef0123456789abcdef";
  const auto chain = ChainBlockHashes(a, 8);
  ASSERT_EQ(chain.size(), 4u);
  // The same block after a different prefix hashes differently; a trailing partial block is
  // left out.
  EXPECT_NE(chain[0], chain[2]);
  EXPECT_EQ(ChainBlockHashes(a + "xyz", 8), chain);
  std::string b = a;
  b[1] = 'X';
  const auto other = ChainBlockHashes(b, 8);
  for (size_t i = 0; i < chain.size(); ++i) EXPECT_NE(other[i], chain[i]) << i;
  EXPECT_TRUE(ChainBlockHashes(a, 0).empty());
  EXPECT_TRUE(ChainBlockHashes("short", 8).empty());
}

TEST(PrefixIndexTest, MatchCountsLeadingBlocksPerTarget) {
  PrefixIndex index(100);
  const auto shared = ChainBlockHashes(std::string(64, 's'), 16);  // 4 blocks
  const auto longer = ChainBlockHashes(std::string(64, 's') + std::string(32, 't'), 16);  // 6
  index.Record("n1", shared);
  EXPECT_EQ(index.Match("n1", longer), 4u);
  EXPECT_EQ(index.Match("n2", longer), 0u);
  index.Record("n2", longer);
  EXPECT_EQ(index.Match("n2", longer), 6u);
  EXPECT_EQ(index.Match("n2", shared), 4u);
  // A chain whose first block differs matches nothing, whatever follows.
  const auto unrelated = ChainBlockHashes(std::string(96, 'u'), 16);
  EXPECT_EQ(index.Match("n2", unrelated), 0u);
  index.Forget("n2");
  EXPECT_EQ(index.Match("n2", longer), 0u);
  EXPECT_EQ(index.Match("n1", longer), 4u);
}

TEST(PrefixIndexTest, CapacityEvictsTailsBeforeHeads) {
  PrefixIndex index(6);
  const auto a = ChainBlockHashes(std::string(64, 'a'), 16);  // 4 blocks
  const auto b = ChainBlockHashes(std::string(64, 'b'), 16);  // 4 blocks
  index.Record("n", a);
  index.Record("n", b);  // 8 > 6: a's two last blocks go, its head stays
  EXPECT_EQ(index.Match("n", b), 4u);
  EXPECT_EQ(index.Match("n", a), 2u);
  index.Record("n", a);  // a again: now b loses its tail
  EXPECT_EQ(index.Match("n", a), 4u);
  EXPECT_EQ(index.Match("n", b), 2u);
}

}  // namespace
}  // namespace pdserve
