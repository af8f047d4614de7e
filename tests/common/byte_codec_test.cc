// The byte codec (common/byte_codec.h): explicit little-endian bytes whatever the host, every
// truncation and lying length refused with a ProtocolError naming the field, nothing read past
// the input.
#include "common/byte_codec.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace pdserve {
namespace {

using namespace std::string_literals;

TEST(ByteCodecTest, IntegersAreLittleEndianByteByByte) {
  ByteWriter w;
  w.U8(0x01);
  w.U16(0x0302);
  w.U32(0x07060504);
  w.U64(0x0f0e0d0c0b0a0908);
  EXPECT_EQ(w.Take(), "\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f"s);
}

TEST(ByteCodecTest, BytesArePrefixedWithTheirU32Length) {
  ByteWriter w;
  w.Bytes("abc");
  w.Bytes("");
  w.Raw("xy");
  EXPECT_EQ(w.Take(), "\x03\x00\x00\x00"s + "abc" + "\x00\x00\x00\x00"s + "xy");
}

TEST(ByteCodecTest, PatchU32OverwritesInPlace) {
  ByteWriter w;
  w.U32(0);
  w.U8(0xaa);
  w.PatchU32(0, 0x04030201);
  EXPECT_EQ(w.size(), 5u);
  EXPECT_EQ(w.Take(), "\x01\x02\x03\x04\xaa"s);
}

TEST(ByteCodecTest, EverythingWrittenReadsBack) {
  ByteWriter w;
  w.U8(0xff);
  w.U16(0xfffe);
  w.U32(0xdeadbeef);
  w.U64(std::numeric_limits<uint64_t>::max() - 1);
  w.U32(7);
  w.Bytes("payload");
  w.U32(2);  // a count of two u16
  w.U16(1);
  w.U16(2);
  const std::string bytes = w.Take();

  ByteReader r(bytes);
  uint8_t u8 = 0;
  uint16_t u16 = 0;
  uint32_t u32 = 0, count = 0;
  uint64_t u64 = 0;
  int32_t i32 = 0;
  std::string text;
  ASSERT_TRUE(r.U8("a", &u8).ok());
  ASSERT_TRUE(r.U16("b", &u16).ok());
  ASSERT_TRUE(r.U32("c", &u32).ok());
  ASSERT_TRUE(r.U64("d", &u64).ok());
  ASSERT_TRUE(r.NonNegativeI32("e", &i32).ok());
  ASSERT_TRUE(r.Bytes("f", 16, &text).ok());
  ASSERT_TRUE(r.Count("g", 4, 2, &count).ok());
  EXPECT_EQ(u8, 0xff);
  EXPECT_EQ(u16, 0xfffe);
  EXPECT_EQ(u32, 0xdeadbeef);
  EXPECT_EQ(u64, std::numeric_limits<uint64_t>::max() - 1);
  EXPECT_EQ(i32, 7);
  EXPECT_EQ(text, "payload");
  EXPECT_EQ(count, 2u);
  EXPECT_EQ(r.position(), bytes.size() - 4);
  std::string_view rest;
  ASSERT_TRUE(r.Raw("h", 4, &rest).ok());
  EXPECT_EQ(rest, "\x01\x00\x02\x00"s);
  EXPECT_TRUE(r.AtEnd());
  EXPECT_EQ(r.remaining(), 0u);
}

TEST(ByteCodecTest, TruncationIsAProtocolErrorNamingTheField) {
  const std::string three = "\x01\x02\x03"s;
  ByteReader r(three);
  uint32_t v = 0;
  const Status s = r.U32("slot", &v);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError);
  EXPECT_NE(s.message().find("slot"), std::string::npos) << s.message();
  EXPECT_EQ(r.remaining(), 3u);  // a short integer consumes nothing

  uint64_t w = 0;
  EXPECT_EQ(ByteReader("").U64("x", &w).code(), StatusCode::kProtocolError);
  std::string_view raw;
  EXPECT_EQ(ByteReader(three).Raw("x", 4, &raw).code(), StatusCode::kProtocolError);
}

TEST(ByteCodecTest, LengthsAreNeverTrusted) {
  std::string text;
  // Longer than the bytes left.
  const std::string five_of_three = "\x05\x00\x00\x00"s + "abc";
  EXPECT_EQ(ByteReader(five_of_three).Bytes("name", 100, &text).code(), StatusCode::kProtocolError);
  // Longer than the caller's cap, even if present.
  const std::string three = "\x03\x00\x00\x00"s + "abc";
  const Status capped = ByteReader(three).Bytes("name", 2, &text);
  EXPECT_EQ(capped.code(), StatusCode::kProtocolError);
  EXPECT_NE(capped.message().find("at most 2"), std::string::npos) << capped.message();
  EXPECT_TRUE(text.empty());
  // A count whose elements cannot fit in what is left allocates nothing and is refused.
  uint32_t count = 0;
  const std::string huge_count = "\xff\xff\x00\x00"s + "abcd";
  EXPECT_EQ(ByteReader(huge_count).Count("pages", 1u << 20, 4, &count).code(),
            StatusCode::kProtocolError);
  EXPECT_EQ(ByteReader("\x09\x00\x00\x00"s).Count("pages", 8, 0, &count).code(),
            StatusCode::kProtocolError);
  EXPECT_EQ(count, 0u);
}

TEST(ByteCodecTest, NonNegativeI32RefusesTheTopBit) {
  int32_t v = 0;
  EXPECT_EQ(ByteReader("\x00\x00\x00\x80"s).NonNegativeI32("token", &v).code(),
            StatusCode::kProtocolError);
  ASSERT_TRUE(ByteReader("\xff\xff\xff\x7f"s).NonNegativeI32("token", &v).ok());
  EXPECT_EQ(v, std::numeric_limits<int32_t>::max());
}

TEST(ByteCodecTest, I32ArraysAreU32sOfTheirBitsAndReadBackWhole) {
  ByteWriter w;
  const std::vector<int32_t> values = {0x04030201, 0, std::numeric_limits<int32_t>::max()};
  w.I32s(values);
  w.I32s({});
  w.I32s(std::vector<int32_t>{-1});
  const std::string bytes = w.Take();
  EXPECT_EQ(bytes,
            "\x01\x02\x03\x04"s + "\x00\x00\x00\x00"s + "\xff\xff\xff\x7f"s + "\xff\xff\xff\xff"s);

  ByteReader r(bytes);
  std::vector<int32_t> back(3);
  ASSERT_TRUE(r.NonNegativeI32s("tokens", back).ok());
  EXPECT_EQ(back, values);
  ASSERT_TRUE(r.NonNegativeI32s("none", {}).ok());
  // The top bit set is a negative value: refused like NonNegativeI32, naming the field.
  int32_t negative[1] = {7};
  const Status s = r.NonNegativeI32s("pages", negative);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError);
  EXPECT_NE(s.message().find("pages"), std::string::npos) << s.message();
}

TEST(ByteCodecTest, AnI32ArrayLongerThanItsInputReadsNothing) {
  const std::string seven = "\x01\x00\x00\x00\x02\x00\x00"s;
  ByteReader r(seven);
  int32_t two[2] = {-5, -5};
  const Status s = r.NonNegativeI32s("tokens", two);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError);
  EXPECT_NE(s.message().find("tokens"), std::string::npos) << s.message();
  EXPECT_EQ(two[0], -5);  // refused before the first element
  EXPECT_EQ(r.remaining(), 7u);
  // And with nothing left at all.
  std::vector<int32_t> one(1);
  EXPECT_EQ(ByteReader("").NonNegativeI32s("x", one).code(), StatusCode::kProtocolError);
}

}  // namespace
}  // namespace pdserve
