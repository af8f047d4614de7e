// Byte-level BPE against the real Qwen2 tokenizer.json in ../shared/tokenizers/qwen2: the 47
// conformance cases of the reference implementation, special tokens, NFC, round trips.
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "testing/test_paths.h"
#include "tokenizer/nfc.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace pdserve {
namespace {

using ::pdserve::testing::ReadFile;
constexpr const char* kQwen2 = "tokenizers/qwen2";

std::vector<std::string> Split(const std::string& text, const std::string& separator) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t pos; (pos = text.find(separator, start)) != std::string::npos;) {
    parts.push_back(text.substr(start, pos - start));
    start = pos + separator.size();
  }
  parts.push_back(text.substr(start));
  return parts;
}

std::unique_ptr<Tokenizer> LoadQwen2() {
  auto tokenizer = Tokenizer::Load(testing::SharedPath(kQwen2));
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  return tokenizer.ok() ? std::move(tokenizer).value() : nullptr;
}

TEST(Qwen2TokenizerTest, ReproducesEveryConformanceCase) {
  PD_REQUIRE_SHARED(kQwen2);
  auto tokenizer = LoadQwen2();
  ASSERT_NE(tokenizer, nullptr);
  const std::string dir = testing::SharedPath(kQwen2);
  const auto inputs = Split(ReadFile(dir + "/cases.inp"), "\n__ggml_vocab_test__\n");
  const auto outputs = Split(ReadFile(dir + "/cases.out"), "\n");
  ASSERT_EQ(inputs.size(), 47u);
  ASSERT_GE(outputs.size(), inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<int32_t> expected;
    std::istringstream line(outputs[i]);
    for (int32_t id; line >> id;) expected.push_back(id);
    const std::vector<int32_t> ids = tokenizer->Encode(inputs[i], /*add_special=*/false);
    EXPECT_EQ(ids, expected) << "case " << i << ": \"" << inputs[i] << "\"";
    EXPECT_EQ(tokenizer->Decode(ids, false), inputs[i]) << "case " << i;
  }
}

TEST(Qwen2TokenizerTest, ReadsVocabularyAndConfig) {
  PD_REQUIRE_SHARED(kQwen2);
  auto tokenizer = LoadQwen2();
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->vocab_size(), 151936);
  EXPECT_EQ(tokenizer->TokenToId("<|im_end|>"), 151645);
  EXPECT_EQ(tokenizer->TokenToId("Hello"), 9707);
  EXPECT_EQ(tokenizer->TokenToId("no such token here"), std::nullopt);
  EXPECT_EQ(tokenizer->bos_id(), 151643);
  ASSERT_FALSE(tokenizer->eos_ids().empty());
  EXPECT_EQ(tokenizer->eos_ids().front(), 151643);
  EXPECT_NE(tokenizer->chat_template().find("<|im_start|>"), std::string::npos);
  // Qwen2 adds no BOS, whatever add_special says.
  EXPECT_EQ(tokenizer->Encode("Hello", true), std::vector<int32_t>{9707});
  EXPECT_EQ(tokenizer->TokenBytes(21927), " Hello");
}

TEST(Qwen2TokenizerTest, MatchesSpecialAndAddedTokensInText) {
  PD_REQUIRE_SHARED(kQwen2);
  auto tokenizer = LoadQwen2();
  ASSERT_NE(tokenizer, nullptr);
  const std::string text = "<|im_start|>user\nHello<|im_end|>[PAD151646]";
  const std::vector<int32_t> ids = tokenizer->Encode(text, false);
  const std::vector<int32_t> expected = {151644, 872, 198, 9707, 151645, 151646};
  EXPECT_EQ(ids, expected);
  EXPECT_TRUE(tokenizer->IsSpecial(151644));
  EXPECT_FALSE(tokenizer->IsSpecial(151646));  // added, but not special
  EXPECT_FALSE(tokenizer->IsSpecial(9707));
  EXPECT_EQ(tokenizer->Decode(ids, /*skip_special=*/false), text);
  EXPECT_EQ(tokenizer->Decode(ids, /*skip_special=*/true), "user\nHello[PAD151646]");
  // A partial special token is plain text.
  EXPECT_EQ(tokenizer->Decode(tokenizer->Encode("<|im_sta", false), false), "<|im_sta");
}

TEST(Qwen2TokenizerTest, NormalizesToNfcAndRoundTripsRandomText) {
  PD_REQUIRE_SHARED(kQwen2);
  auto tokenizer = LoadQwen2();
  ASSERT_NE(tokenizer, nullptr);
  // "e" + COMBINING ACUTE is encoded as the precomposed "é".
  EXPECT_EQ(tokenizer->Encode("caf\x65\xCC\x81", false), tokenizer->Encode("caf\xC3\xA9", false));
  std::mt19937 rng(1234);
  // Code points from several scripts, marks and emoji; the decode equals the NFC input.
  const std::vector<std::pair<char32_t, char32_t>> blocks = {
      {0x20, 0x7E},     {0xA0, 0x24F},      {0x300, 0x36F},   {0x370, 0x3FF},   {0x400, 0x4FF},
      {0x600, 0x6FF},   {0x900, 0x97F},     {0x1100, 0x11FF}, {0x3040, 0x30FF}, {0x4E00, 0x4FFF},
      {0xAC00, 0xAD00}, {0x1F300, 0x1F64F}, {0x9, 0xD}};
  for (int trial = 0; trial < 200; ++trial) {
    std::string text;
    const int length = static_cast<int>(rng() % 40);
    for (int i = 0; i < length; ++i) {
      const auto& [lo, hi] = blocks[rng() % blocks.size()];
      const char32_t cp = lo + rng() % (hi - lo + 1);
      utf8::Append(cp, text);
    }
    const std::vector<int32_t> ids = tokenizer->Encode(text, false);
    EXPECT_EQ(tokenizer->Decode(ids, false), nfc::Normalize(text)) << "trial " << trial;
  }
}

TEST(Qwen2TokenizerTest, KeepsInvalidUtf8BytesAsBytes) {
  PD_REQUIRE_SHARED(kQwen2);
  auto tokenizer = LoadQwen2();
  ASSERT_NE(tokenizer, nullptr);
  const std::vector<std::string> texts = {"\xFF",
                                          "abc\xC3",
                                          "\xE2\x82 euro",
                                          "\xC0\xAF\xED\xA0\x80",
                                          std::string("nul\0byte", 8),
                                          "ok \xF0\x9F\x98 then"};
  for (const std::string& text : texts) {
    const std::vector<int32_t> ids = tokenizer->Encode(text, false);
    EXPECT_EQ(tokenizer->Decode(ids, false), text);
  }
}

}  // namespace
}  // namespace pdserve
