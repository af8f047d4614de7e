// EncodeWithin (tokenizer/bounded_encode.h) on the real tokenizers in the shared data: a prefix
// cut where EncodeWithin cuts encodes to the start of the whole text's ids (so a prefix over
// the limit proves the text is, and no fitting prompt is refused), and the ids are Encode's
// whenever they fit.
#include "tokenizer/bounded_encode.h"

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "testing/test_paths.h"

namespace pdserve {
namespace {

// Varied text: words, punctuation, digits, runs of spaces, newlines, accents, combining marks,
// CJK and a special token, in a seeded random order.
std::string VariedText(size_t bytes, uint32_t seed) {
  const std::vector<std::string> words = {"Once",         "upon",         "a",
                                          "time",         "there",        "was",
                                          "little",       "girl.",        "Lily",
                                          "liked",        "to",           "play",
                                          "outside",      "1234",         "3.14159",
                                          "don't",        "caf\u00e9",    "e\u0301t\u00e9",
                                          "\u4f60\u597d", "\u4e16\u754c", "<|im_start|>",
                                          "<s>",          "!!!",          "(x+y)",
                                          "\u00a0nbsp",   "tab\tbed",     "x\n\ny",
                                          "end.\n",       "  ",           "\u3000",
                                          "\xff\xfe"};
  std::mt19937 rng(seed);
  std::string text;
  while (text.size() < bytes) {
    text += words[rng() % words.size()];
    text += ' ';
  }
  return text;
}

void CheckPrefixesAndLimits(const std::string& relative) {
  auto loaded = Tokenizer::Load(testing::SharedPath(relative));
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const Tokenizer& tokenizer = **loaded;
  for (uint32_t seed = 1; seed <= 3; ++seed) {
    const std::string text = VariedText(size_t{48} << 10, seed);
    const std::vector<int32_t> all = tokenizer.Encode(text, /*add_special=*/false);
    for (size_t from = 100; from + 2000 < text.size(); from += 2000) {
      const size_t cut = PrefixCut(text, from, from + 2000);
      ASSERT_NE(cut, std::string_view::npos);
      const std::vector<int32_t> prefix = tokenizer.Encode(text.substr(0, cut), false);
      ASSERT_LE(prefix.size(), all.size());
      EXPECT_TRUE(std::equal(prefix.begin(), prefix.end(), all.begin()))
          << "seed " << seed << ": the prefix cut at " << cut << " encodes differently";
    }
    const std::vector<int32_t> with_specials = tokenizer.Encode(text, true);
    EXPECT_EQ(EncodeWithin(tokenizer, text, true, with_specials.size()), with_specials);
    EXPECT_FALSE(EncodeWithin(tokenizer, text, true, with_specials.size() - 1).has_value());
    // Small limits: prefixes are encoded first, and settle it.
    EXPECT_FALSE(EncodeWithin(tokenizer, text, true, 511).has_value());
  }
}

// Where a tokenizer vouches for a bound on the bytes one token stands for, no text beats it.
void CheckByteBound(const std::string& relative, bool expect_bound) {
  auto loaded = Tokenizer::Load(testing::SharedPath(relative));
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const Tokenizer& tokenizer = **loaded;
  const size_t bound = tokenizer.max_text_bytes_per_token();
  EXPECT_EQ(bound > 0, expect_bound) << "bound " << bound;
  if (bound == 0) return;
  std::vector<std::string> texts = {VariedText(size_t{32} << 10, 7), std::string(20000, 'a'),
                                    std::string(20000, ' '), std::string(5000, '\xff')};
  for (const char* unit : {"\u4f60\u597d", "\u1100\u1161\u11a8", "e\u0301", "\uff21"}) {
    std::string text;
    while (text.size() < 20000) text += unit;
    texts.push_back(text);
  }
  for (const std::string& text : texts) {
    const size_t tokens = tokenizer.Encode(text, false).size();
    const auto counted = static_cast<size_t>(std::count_if(text.begin(), text.end(), [](char c) {
      return std::string_view(" \t\n\r\v\f").find(c) == std::string_view::npos;
    }));
    EXPECT_GE(tokens * bound, counted) << relative << ": " << tokens << " tokens for "
                                       << text.size() << " bytes (" << text.substr(0, 12) << "...)";
  }
  // A text over the bound is refused without being encoded.
  EXPECT_FALSE(EncodeWithin(tokenizer, std::string(512 * bound + bound, 'a'), true, 511));
}

TEST(BoundedEncodeTest, SentencePieceByteBound) {
  PD_REQUIRE_SHARED("models/stories260K");
  CheckByteBound("models/stories260K", /*expect_bound=*/true);
}

TEST(BoundedEncodeTest, ByteLevelBpeByteBound) {
  PD_REQUIRE_SHARED("tokenizers/qwen2");
  CheckByteBound("tokenizers/qwen2", /*expect_bound=*/true);
}

TEST(BoundedEncodeTest, SentencePiecePrefixesAndLimits) {
  PD_REQUIRE_SHARED("models/stories260K");
  CheckPrefixesAndLimits("models/stories260K");
}

TEST(BoundedEncodeTest, ByteLevelBpePrefixesAndLimits) {
  PD_REQUIRE_SHARED("tokenizers/qwen2");
  CheckPrefixesAndLimits("tokenizers/qwen2");
}

TEST(BoundedEncodeTest, ShortAndSpacelessTextsAreEncodedWhole) {
  PD_REQUIRE_SHARED("models/stories260K");
  auto loaded = Tokenizer::Load(testing::SharedPath("models/stories260K"));
  ASSERT_TRUE(loaded.ok());
  const Tokenizer& tokenizer = **loaded;
  EXPECT_EQ(EncodeWithin(tokenizer, "Hello", true, 100), tokenizer.Encode("Hello", true));
  const std::string spaceless(100000, 'a');
  const std::vector<int32_t> ids = tokenizer.Encode(spaceless, true);
  EXPECT_EQ(EncodeWithin(tokenizer, spaceless, true, ids.size()), ids);
  EXPECT_FALSE(EncodeWithin(tokenizer, spaceless, true, ids.size() - 1).has_value());
}

}  // namespace
}  // namespace pdserve
