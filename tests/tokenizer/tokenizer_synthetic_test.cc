// WriteSyntheticTokenizer: the written tokenizer.json loads through the real loader, has
// exactly the requested ids, decodes every id and round-trips any text and any bytes.
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "testing/test_paths.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace pdserve {
namespace {

using ::pdserve::testing::ReadFile;
std::unique_ptr<Tokenizer> MakeSynthetic(int32_t vocab_size, uint64_t seed, std::string* dir_out) {
  const std::string dir = testing::MakeTempDir("pd_synth_tok_");
  if (dir_out != nullptr) *dir_out = dir;
  const Status written = WriteSyntheticTokenizer(dir, vocab_size, seed);
  EXPECT_TRUE(written.ok()) << written.ToString();
  auto tokenizer = Tokenizer::Load(dir);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  return tokenizer.ok() ? std::move(tokenizer).value() : nullptr;
}

// Random code points from all planes (no surrogates), as UTF-8.
std::string RandomUnicode(std::mt19937& rng, int length) {
  std::string text;
  for (int i = 0; i < length; ++i) {
    char32_t cp;
    switch (rng() % 4) {
      case 0:
        cp = 0x20 + rng() % 0x5F;
        break;
      case 1:
        cp = rng() % 0x800;
        break;
      case 2:
        cp = rng() % 0x10000;
        break;
      default:
        cp = 0x10000 + rng() % 0x100000;
        break;
    }
    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
    utf8::Append(cp, text);
  }
  return text;
}

TEST(SyntheticTokenizerTest, HasExactVocabularyAndSpecialTokensAtTheTop) {
  std::string dir;
  auto tokenizer = MakeSynthetic(1000, 1, &dir);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->vocab_size(), 1000);
  EXPECT_EQ(tokenizer->TokenToId("<|begin_of_text|>"), 996);
  EXPECT_EQ(tokenizer->TokenToId("<|im_end|>"), 999);
  EXPECT_EQ(tokenizer->bos_id(), 996);
  ASSERT_FALSE(tokenizer->eos_ids().empty());
  EXPECT_EQ(tokenizer->eos_ids().front(), 997);
  EXPECT_FALSE(tokenizer->chat_template().empty());
  for (int32_t id = 996; id < 1000; ++id) EXPECT_TRUE(tokenizer->IsSpecial(id));
  EXPECT_FALSE(tokenizer->IsSpecial(995));
  // BOS comes first with add_special; specials in the text are single tokens.
  const std::vector<int32_t> ids = tokenizer->Encode("<|im_start|>user hi<|im_end|>", true);
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids[0], 996);
  EXPECT_EQ(ids[1], 998);
  EXPECT_EQ(ids.back(), 999);
  EXPECT_EQ(tokenizer->Decode(ids, /*skip_special=*/true), "user hi");
  // Learned merges make common English words single tokens.
  EXPECT_EQ(tokenizer->Encode(" the", false).size(), 1u);
  std::filesystem::remove_all(dir);
}

TEST(SyntheticTokenizerTest, RoundTripsRandomUnicodeAndRandomBytes) {
  std::string dir;
  auto tokenizer = MakeSynthetic(5000, 7, &dir);
  ASSERT_NE(tokenizer, nullptr);
  std::mt19937 rng(99);
  for (int trial = 0; trial < 300; ++trial) {
    const std::string text = RandomUnicode(rng, static_cast<int>(rng() % 64));
    const std::vector<int32_t> ids = tokenizer->Encode(text, true);
    EXPECT_EQ(tokenizer->Decode(ids, true), text) << "trial " << trial;
    std::string bytes(rng() % 64, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    EXPECT_EQ(tokenizer->Decode(tokenizer->Encode(bytes, false), false), bytes);
  }
  std::filesystem::remove_all(dir);
}

TEST(SyntheticTokenizerTest, FullSizeVocabularyDecodesEveryId) {
  std::string dir;
  auto tokenizer = MakeSynthetic(151936, 3, &dir);
  ASSERT_NE(tokenizer, nullptr);
  ASSERT_EQ(tokenizer->vocab_size(), 151936);
  for (int32_t id = 0; id < tokenizer->vocab_size(); ++id) {
    const std::string bytes = tokenizer->TokenBytes(id);
    ASSERT_FALSE(bytes.empty()) << "id " << id;
    const int32_t one[] = {id};
    ASSERT_EQ(tokenizer->Decode(one, false), bytes);
  }
  const std::string text = "Engineers measure tokens per second: 12,345 — ça marche! 🚀\n\n  x";
  EXPECT_EQ(tokenizer->Decode(tokenizer->Encode(text, true), true), text);
  std::filesystem::remove_all(dir);
}

TEST(SyntheticTokenizerTest, IsDeterministicPerSeed) {
  std::string a, b, c;
  ASSERT_NE(MakeSynthetic(3000, 5, &a), nullptr);
  ASSERT_NE(MakeSynthetic(3000, 5, &b), nullptr);
  ASSERT_NE(MakeSynthetic(3000, 6, &c), nullptr);
  EXPECT_EQ(ReadFile(a + "/tokenizer.json"), ReadFile(b + "/tokenizer.json"));
  EXPECT_NE(ReadFile(a + "/tokenizer.json"), ReadFile(c + "/tokenizer.json"));
  for (const auto& dir : {a, b, c}) std::filesystem::remove_all(dir);
}

TEST(SyntheticTokenizerTest, RejectsTooSmallVocabulary) {
  const std::string dir = testing::MakeTempDir("pd_synth_tok_");
  const Status status = WriteSyntheticTokenizer(dir, 100, 1);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("vocab_size"), std::string::npos);
  EXPECT_TRUE(WriteSyntheticTokenizer(dir, 300, 1).ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace pdserve
