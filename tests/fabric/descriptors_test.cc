#include "fabric/descriptors.h"

#include <string>

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

// The bytes another process parses: explicit little-endian (common/byte_codec.h), pinned here
// so that a change of codec cannot change them unnoticed.
TEST(DescriptorsTest, EncodingIsPinnedLittleEndian) {
  using namespace std::string_literals;
  const MemoryDescriptor d{4096, {{0x1122334455667788, 0x0102030405060708}}};
  EXPECT_EQ(d.Serialize(), "FPDM"s + "\x01\x00"s + "\x00\x10\x00\x00\x00\x00\x00\x00"s +
                               "\x01\x00"s + "\x88\x77\x66\x55\x44\x33\x22\x11"s +
                               "\x08\x07\x06\x05\x04\x03\x02\x01"s);
  const TransferEngineAddress a{Provider::kTcp, 0x0102030405060708, {"ep"}};
  EXPECT_EQ(a.Serialize(), "FPDA"s + "\x01\x00"s + "\x01\x00"s +
                               "\x08\x07\x06\x05\x04\x03\x02\x01"s + "\x01\x00"s +
                               "\x02\x00\x00\x00"s + "ep");
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
