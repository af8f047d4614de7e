// EncodeWithin (tokenizer/bounded_encode.h) on the real tokenizers in the shared data: a prefix
// cut where EncodeWithin cuts encodes to the start of the whole text's ids (so a prefix over
// the limit proves the text is, and no fitting prompt is refused), and the ids are Encode's
// whenever they fit.
#include "tokenizer/bounded_encode.h"

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
