#include "common/sha256.h"

#include <string>

#include <gtest/gtest.h>

namespace pdserve {
namespace {

std::string Hex(std::span<const uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (uint8_t b : bytes) {
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}

// FIPS 180-4 examples (NIST CSRC "Examples with Intermediate Values", SHA-256) and the
// long-message vectors of FIPS 180-2 Appendix B.
TEST(Sha256Test, MatchesFips180Vectors) {
  EXPECT_EQ(Hex(Sha256Hash("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Hex(Sha256Hash("")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Hex(Sha256Hash("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(Hex(Sha256Hash("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmno"
                           "ijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu")),
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  EXPECT_EQ(Hex(Sha256Hash(std::string(1000000, 'a'))),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256Test, IncrementalUpdatesAgreeWithOneShotAtEveryBoundary) {
  // Splits across the 64-byte block and the 56-byte padding boundary exercise the buffering.
  std::string message;
  for (int i = 0; i < 300; ++i) message += static_cast<char>(i * 7 + 3);
  for (size_t len : {0, 1, 55, 56, 63, 64, 65, 119, 120, 128, 300}) {
    const std::string_view m(message.data(), len);
    const Sha256Digest expected = Sha256Hash(m);
    for (size_t split = 0; split <= len; split += 13) {
      Sha256 h;
      h.Update(m.substr(0, split));
      h.Update(m.substr(split));
      EXPECT_EQ(h.Finish(), expected) << "len " << len << " split " << split;
    }
  }
}

// RFC 4231 §4.2–4.8 test cases 1–7 (HMAC-SHA-256 column).
TEST(HmacSha256Test, MatchesRfc4231Vectors) {
  EXPECT_EQ(Hex(HmacSha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(Hex(HmacSha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(Hex(HmacSha256(std::string(20, '\xaa'), std::string(50, '\xdd'))),
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  std::string key4;
  for (int i = 1; i <= 25; ++i) key4 += static_cast<char>(i);
  EXPECT_EQ(Hex(HmacSha256(key4, std::string(50, '\xcd'))),
            "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  // Test case 5 publishes only the first 128 bits.
  EXPECT_EQ(Hex(HmacSha256(std::string(20, '\x0c'), "Test With Truncation")).substr(0, 32),
            "a3b6167473100ee06e0c796c2955552b");
  const std::string long_key(131, '\xaa');
  EXPECT_EQ(Hex(HmacSha256(long_key, "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  EXPECT_EQ(Hex(HmacSha256(long_key,
                           "This is a test using a larger than block-size key and a larger than "
                           "block-size data. The key needs to be hashed before being used by the "
                           "HMAC algorithm.")),
            "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

TEST(ConstantTimeEqualTest, ComparesContentAndLength) {
  const Sha256Digest a = Sha256Hash("a");
  Sha256Digest b = a;
  EXPECT_TRUE(ConstantTimeEqual(a, b));
  for (size_t i : {size_t{0}, size_t{17}, size_t{31}}) {
    b = a;
    b[i] ^= 1;
    EXPECT_FALSE(ConstantTimeEqual(a, b)) << "byte " << i;
  }
  EXPECT_FALSE(ConstantTimeEqual(std::span<const uint8_t>(a).first(31), a));
  EXPECT_TRUE(ConstantTimeEqual(std::span<const uint8_t>(), std::span<const uint8_t>()));
}

}  // namespace
}  // namespace pdserve
