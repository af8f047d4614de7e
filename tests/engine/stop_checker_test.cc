#include "engine/stop_checker.h"

#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace pdserve {
namespace {

constexpr int32_t kEos = 2;
constexpr int32_t kWord = 100;  // any ordinary token id
const std::vector<int32_t> kEosIds = {kEos};

SamplingParams WithStops(std::vector<std::string> stop, int max_tokens = 100) {
  SamplingParams p;
  p.stop = std::move(stop);
  p.max_tokens = max_tokens;
  return p;
}

// Feeds pieces as ordinary tokens; returns everything emitted, stopping at the first stop.
struct FeedResult {
  std::string emitted;
  StopDecision last;
  int updates = 0;
};
FeedResult Feed(StopChecker& checker, const std::vector<std::string>& pieces) {
  FeedResult run;
  for (const std::string& piece : pieces) {
    run.last = checker.Update(kWord, piece);
    run.emitted += run.last.emit;
    ++run.updates;
    if (run.last.stop) break;
  }
  return run;
}

TEST(StopCheckerTest, WithoutStopsEverythingIsEmittedAtOnce) {
  StopChecker checker(WithStops({}), kEosIds);
  const StopDecision d = checker.Update(kWord, "Hello");
  EXPECT_FALSE(d.stop);
  EXPECT_EQ(d.reason, FinishReason::kNone);
  EXPECT_EQ(d.emit, "Hello");
  EXPECT_EQ(checker.held_back(), 0u);
}

TEST(StopCheckerTest, StopStringInsideOneTokenCutsBeforeIt) {
  StopChecker checker(WithStops({"wor"}), kEosIds);
  const FeedResult run = Feed(checker, {"Hello world"});
  EXPECT_TRUE(run.last.stop);
  EXPECT_EQ(run.last.reason, FinishReason::kStop);
  EXPECT_EQ(run.emitted, "Hello ");
  EXPECT_EQ(checker.text(), "Hello ");
}

TEST(StopCheckerTest, StopStringAcrossTokensIsHeldBackThenCut) {
  StopChecker checker(WithStops({"END"}), kEosIds);
  StopDecision d = checker.Update(kWord, "abc E");
  EXPECT_FALSE(d.stop);
  EXPECT_EQ(d.emit, "abc ");  // "E" could begin "END"
  EXPECT_EQ(checker.held_back(), 1u);
  d = checker.Update(kWord, "N");
  EXPECT_FALSE(d.stop);
  EXPECT_EQ(d.emit, "");
  EXPECT_EQ(checker.held_back(), 2u);
  d = checker.Update(kWord, "D and more");
  EXPECT_TRUE(d.stop);
  EXPECT_EQ(d.reason, FinishReason::kStop);
  EXPECT_EQ(d.emit, "");
  EXPECT_EQ(checker.text(), "abc ");
  // Nothing comes out after the stop.
  EXPECT_EQ(checker.Flush("tail"), "");
  const StopDecision again = checker.Update(kWord, "x");
  EXPECT_TRUE(again.stop);
  EXPECT_EQ(again.emit, "");
}

TEST(StopCheckerTest, HeldBackTextIsReleasedWhenItCannotBecomeAStop) {
  StopChecker checker(WithStops({"END"}), kEosIds);
  EXPECT_EQ(checker.Update(kWord, "abc EN").emit, "abc ");
  const StopDecision d = checker.Update(kWord, "Xyz");
  EXPECT_FALSE(d.stop);
  EXPECT_EQ(d.emit, "ENXyz");
  EXPECT_EQ(checker.held_back(), 0u);
}

TEST(StopCheckerTest, OverlappingPrefixesAreMatched) {
  // After "aaa" the matcher must fall back to "aa", not restart: "aab" starts at 1.
  StopChecker checker(WithStops({"aab"}), kEosIds);
  const FeedResult run = Feed(checker, {"a", "a", "a", "b", "zzz"});
  EXPECT_TRUE(run.last.stop);
  EXPECT_EQ(run.updates, 4);
  EXPECT_EQ(run.emitted, "a");
  EXPECT_EQ(checker.text(), "a");
}

TEST(StopCheckerTest, FirstStopToCompleteWins) {
  // "bc" completes before "abcd" does, although "abcd" starts earlier.
  StopChecker checker(WithStops({"abcd", "bc"}), kEosIds);
  Feed(checker, {"xabcd"});
  EXPECT_EQ(checker.text(), "xa");
  // Completing at the same byte, the longer one (starting earlier) cuts more.
  StopChecker checker2(WithStops({"cd", "bcd"}), kEosIds);
  Feed(checker2, {"xab", "cd"});
  EXPECT_EQ(checker2.text(), "xa");
}

TEST(StopCheckerTest, MultiByteStopStringAcrossTokens) {
  StopChecker checker(WithStops({"\xc3\xa9!"}), kEosIds);  // "é!"
  const FeedResult run = Feed(checker, {"caf\xc3\xa9", "!", " more"});
  EXPECT_TRUE(run.last.stop);
  EXPECT_EQ(run.emitted, "caf");
}

TEST(StopCheckerTest, EosStopsAndItsTextIsDropped) {
  StopChecker checker(WithStops({"END"}), kEosIds);
  EXPECT_EQ(checker.Update(kWord, "one E").emit, "one ");
  const StopDecision d = checker.Update(kEos, "</s>");
  EXPECT_TRUE(d.stop);
  EXPECT_EQ(d.reason, FinishReason::kStop);
  EXPECT_EQ(d.emit, "E");  // held back text is real output once nothing can follow
  EXPECT_EQ(checker.text(), "one E");
}

TEST(StopCheckerTest, IgnoreEosKeepsGenerating) {
  SamplingParams p;
  p.ignore_eos = true;
  StopChecker checker(p, kEosIds);
  const StopDecision d = checker.Update(kEos, "");
  EXPECT_FALSE(d.stop);
  EXPECT_FALSE(checker.stopped());
}

TEST(StopCheckerTest, StopTokenIdsStopEvenWithIgnoreEos) {
  SamplingParams p;
  p.ignore_eos = true;
  p.stop_token_ids = {7};
  StopChecker checker(p, kEosIds);
  EXPECT_FALSE(checker.Update(kWord, "a").stop);
  const StopDecision d = checker.Update(7, "seven");
  EXPECT_TRUE(d.stop);
  EXPECT_EQ(d.reason, FinishReason::kStop);
  EXPECT_EQ(d.emit, "");
  EXPECT_EQ(checker.text(), "a");
}

TEST(StopCheckerTest, MaxTokensEndsWithLengthAndReleasesEverything) {
  StopChecker checker(WithStops({"END"}, /*max_tokens=*/3), kEosIds);
  EXPECT_FALSE(checker.Update(kWord, "a").stop);
  EXPECT_FALSE(checker.Update(kWord, "b").stop);
  const StopDecision d = checker.Update(kWord, "cE");
  EXPECT_TRUE(d.stop);
  EXPECT_EQ(d.reason, FinishReason::kLength);
  EXPECT_EQ(d.emit, "cE");
  EXPECT_EQ(checker.num_tokens(), 3);
  // The decoder's remainder still joins the text after a length stop.
  EXPECT_EQ(checker.Flush("\xef\xbf\xbd"), "\xef\xbf\xbd");
}

TEST(StopCheckerTest, StopOnTheLastAllowedTokenIsAStopNotALength) {
  StopChecker checker(WithStops({"EN"}, /*max_tokens=*/2), kEosIds);
  checker.Update(kWord, "aE");
  const StopDecision d = checker.Update(kWord, "N");
  EXPECT_EQ(d.reason, FinishReason::kStop);
  SamplingParams p;
  p.max_tokens = 1;
  StopChecker eos_checker(p, kEosIds);
  EXPECT_EQ(eos_checker.Update(kEos, "").reason, FinishReason::kStop);
}

TEST(StopCheckerTest, FlushReleasesHeldTextAndStillCutsAtAStop) {
  StopChecker checker(WithStops({"END"}), kEosIds);
  EXPECT_EQ(checker.Update(kWord, "abc EN").emit, "abc ");
  EXPECT_EQ(checker.Flush(), "EN");
  EXPECT_EQ(checker.Flush(), "");
  StopChecker cut(WithStops({"END"}), kEosIds);
  EXPECT_EQ(cut.Update(kWord, "abc EN").emit, "abc ");
  EXPECT_EQ(cut.Flush("D!"), "");
  EXPECT_EQ(cut.text(), "abc ");
}

// Reference: the text cut before the first stop string to complete (longest on a tie).
std::string ReferenceCut(const std::string& text, const std::vector<std::string>& stops) {
  for (size_t end = 1; end <= text.size(); ++end) {
    size_t best = std::string::npos;
    for (const std::string& s : stops) {
      if (s.size() <= end && text.compare(end - s.size(), s.size(), s) == 0) {
        best = std::min(best, end - s.size());
      }
    }
    if (best != std::string::npos) return text.substr(0, best);
  }
  return text;
}

TEST(StopCheckerTest, StreamedTextAlwaysEqualsTheReferenceCut) {
  const std::vector<std::string> alphabet = {"a", "b", "ab", "ba", "c", "abc", "bb", ""};
  const std::vector<std::string> stops = {"abab", "bbc", "cab"};
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<std::string> pieces;
    std::string full;
    for (int i = 0; i < 12; ++i) {
      pieces.push_back(alphabet[rng() % alphabet.size()]);
      full += pieces.back();
    }
    StopChecker checker(WithStops(stops), kEosIds);
    FeedResult run = Feed(checker, pieces);
    if (!run.last.stop) run.emitted += checker.Flush();
    const std::string expected = ReferenceCut(full, stops);
    ASSERT_EQ(run.emitted, expected) << "trial " << trial;
    ASSERT_EQ(checker.text(), expected);
    ASSERT_EQ(run.last.stop, expected.size() < full.size());
  }
}

}  // namespace
}  // namespace pdserve
