// SentencePiece (tokenizer.model) through Tokenizer::Load on the real stories260K model in
// ../shared/models: golden prompt ids, round trips, byte fallback streamed across tokens.
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "testing/test_paths.h"
#include "tokenizer/tokenizer.h"

namespace pdserve {
namespace {

constexpr const char* kStories = "models/stories260K";

std::unique_ptr<Tokenizer> LoadStories() {
  auto tokenizer = Tokenizer::Load(testing::SharedPath(kStories));
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  return tokenizer.ok() ? std::move(tokenizer).value() : nullptr;
}

TEST(SentencePieceTokenizerTest, EncodesGoldenPromptIds) {
  PD_REQUIRE_SHARED(kStories);
  auto tokenizer = LoadStories();
  ASSERT_NE(tokenizer, nullptr);
  std::ifstream in(testing::SharedPath(kStories) + "/golden.json");
  const nlohmann::json golden = nlohmann::json::parse(in);
  ASSERT_FALSE(golden["cases"].empty());
  for (const auto& c : golden["cases"]) {
    const std::string prompt = c["prompt"].get<std::string>();
    const auto expected = c["prompt_ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> ids = tokenizer->Encode(prompt, /*add_special=*/true);
    EXPECT_EQ(ids, expected) << "prompt \"" << prompt << "\"";
    EXPECT_EQ(tokenizer->Decode(ids, /*skip_special=*/true), prompt);
  }
}

TEST(SentencePieceTokenizerTest, ReadsSpecialTokens) {
  PD_REQUIRE_SHARED(kStories);
  auto tokenizer = LoadStories();
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->vocab_size(), 512);
  EXPECT_EQ(tokenizer->bos_id(), 1);
  EXPECT_EQ(tokenizer->eos_ids(), std::vector<int32_t>{2});
  EXPECT_EQ(tokenizer->bos_token(), "<s>");
  EXPECT_TRUE(tokenizer->IsSpecial(1));
  EXPECT_FALSE(tokenizer->IsSpecial(403));
  EXPECT_EQ(tokenizer->TokenToId("</s>"), 2);
  EXPECT_EQ(tokenizer->TokenToId("definitely-not-a-piece"), std::nullopt);
  EXPECT_EQ(tokenizer->Encode("", true), std::vector<int32_t>{1});
  EXPECT_TRUE(tokenizer->Encode("", false).empty());
  // Special pieces written in the text are single tokens.
  const std::vector<int32_t> ids = tokenizer->Encode("Hi</s>", false);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.back(), 2);
  EXPECT_EQ(tokenizer->Decode(ids, true), "Hi");
  EXPECT_EQ(tokenizer->Decode(ids, false), "Hi</s>");
}

TEST(SentencePieceTokenizerTest, RoundTripsTextWithByteFallback) {
  PD_REQUIRE_SHARED(kStories);
  auto tokenizer = LoadStories();
  ASSERT_NE(tokenizer, nullptr);
  // The model's normalizer folds repeated spaces, so these use single spaces.
  for (const std::string text :
       {"Once upon a time, there was a dog.", "Zoë ate 日本の crème brûlée 🦙!",
        "tabs\tand\nnew lines", "Ελληνικά и кириллица", "1234567890"}) {
    const std::vector<int32_t> ids = tokenizer->Encode(text, false);
    EXPECT_EQ(tokenizer->Decode(ids, false), text);
  }
}

TEST(SentencePieceTokenizerTest, StreamsUtf8SplitAcrossByteTokens) {
  PD_REQUIRE_SHARED(kStories);
  auto tokenizer = LoadStories();
  ASSERT_NE(tokenizer, nullptr);
  const std::string text = "The 🦙 saw 日本.";
  const std::vector<int32_t> ids = tokenizer->Encode(text, true);
  IncrementalDecoder decoder(tokenizer.get(), /*skip_special=*/true);
  std::string streamed;
  int held_back = 0;
  for (int32_t id : ids) {
    const std::string piece = decoder.Append(id);
    if (piece.empty() && !tokenizer->IsSpecial(id)) ++held_back;
    // Every emitted piece is complete UTF-8 on its own.
    for (unsigned char c : std::string_view(piece).substr(0, 1)) EXPECT_NE(c & 0xC0, 0x80);
    streamed += piece;
  }
  streamed += decoder.Flush();
  // The first piece keeps its dummy-prefix space when streamed.
  EXPECT_EQ(streamed, " " + text);
  EXPECT_GT(held_back, 0) << "expected multi-byte characters spread over byte tokens";
}

TEST(SentencePieceTokenizerTest, InvalidUtf8InputDoesNotCrash) {
  PD_REQUIRE_SHARED(kStories);
  auto tokenizer = LoadStories();
  ASSERT_NE(tokenizer, nullptr);
  const std::vector<int32_t> ids = tokenizer->Encode("ab\xFF\xC3 cd\xE2\x82", false);
  const std::string text = tokenizer->Decode(ids, false);
  EXPECT_NE(text.find("ab"), std::string::npos);
  EXPECT_NE(text.find("\xEF\xBF\xBD"), std::string::npos);  // U+FFFD stands for bad bytes
  for (int32_t id : ids) EXPECT_LT(id, tokenizer->vocab_size());
}

}  // namespace
}  // namespace pdserve
