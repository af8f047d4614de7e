#include "fabric/descriptors.h"

#include <gtest/gtest.h>

namespace pdserve::fabric {
namespace {

TEST(DescriptorsTest, MemoryDescriptorRoundTrips) {
  MemoryDescriptor d{1 << 20, {{0x7f0000001000, 42}, {0, 7}}};
  auto parsed = MemoryDescriptor::Parse(d.Serialize());
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(*parsed, d);
}

TEST(DescriptorsTest, TransferEngineAddressRoundTripsThroughHex) {
  TransferEngineAddress a{
      Provider::kTcp, 0x1234567890abcdefULL, {std::string("\x02\x00\x1f\x90", 4), "x"}};
  auto bytes = HexDecode(HexEncode(a.Serialize()));
  ASSERT_TRUE(bytes.ok());
  auto parsed = TransferEngineAddress::Parse(*bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(*parsed, a);
}

TEST(DescriptorsTest, RejectsTruncatedCorruptAndForeignBytes) {
  const std::string good = MemoryDescriptor{4096, {{1, 2}}}.Serialize();
  for (size_t n = 0; n < good.size(); ++n) {
    EXPECT_FALSE(MemoryDescriptor::Parse(good.substr(0, n)).ok()) << "prefix " << n;
  }
  EXPECT_FALSE(MemoryDescriptor::Parse(good + "x").ok());
  const std::string address = TransferEngineAddress{Provider::kShm, 1, {"ep"}}.Serialize();
  EXPECT_EQ(MemoryDescriptor::Parse(address).status().code(), StatusCode::kInvalidArgument);
  std::string bad_version = good;
  bad_version[4] = 9;
  EXPECT_FALSE(MemoryDescriptor::Parse(bad_version).ok());
  EXPECT_FALSE(MemoryDescriptor::Parse(MemoryDescriptor{0, {{1, 2}}}.Serialize()).ok());
  EXPECT_FALSE(
      TransferEngineAddress::Parse(TransferEngineAddress{Provider::kShm, 1, {}}.Serialize()).ok());
  EXPECT_FALSE(HexDecode("abc").ok());
  EXPECT_FALSE(HexDecode("zz").ok());
}

TEST(DescriptorsTest, ParsesProviderNames) {
  EXPECT_EQ(*ParseProvider("tcp"), Provider::kTcp);
  EXPECT_EQ(LibfabricProviderString(Provider::kTcp), "tcp;ofi_rxm");
  EXPECT_EQ(LibfabricProviderString(Provider::kVerbs), "verbs;ofi_rxm");
  EXPECT_EQ(ParseProvider("rdma").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve::fabric
