// The step message the TP leader publishes to its rank workers (engine/rank_workers.h): the
// bytes of the one codec (common/byte_codec.h), read back to the same chunks, and every
// truncated, padded or inconsistent message refused rather than run.
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/rank_workers.h"

namespace pdserve {
namespace {

using namespace std::string_literals;

TEST(StepMessageTest, ChunksReadBackWithTheirTokensPagesStartsAndLogitWishes) {
  const std::vector<int32_t> tokens_a = {5, 6, 7}, tokens_b = {9};
  const std::vector<PageId> pages_a = {3, 4}, pages_b = {0};
  const std::vector<SequenceChunk> chunks = {
      {.tokens = tokens_a, .start = 0, .pages = pages_a, .want_logits = true, .logit_rows = 2},
      {.tokens = tokens_b, .start = (int64_t{1} << 40) + 17, .pages = pages_b, .want_logits = true},
      {.tokens = tokens_a, .start = 0, .pages = pages_a, .want_logits = false},
      {.tokens = {}, .start = 3, .pages = {}, .want_logits = false}};

  Result<DecodedStep> step = DecodeStep(EncodeStep(chunks));
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  ASSERT_EQ(step->chunks.size(), chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    const SequenceChunk& got = step->chunks[i];
    EXPECT_EQ(std::vector<int32_t>(got.tokens.begin(), got.tokens.end()),
              std::vector<int32_t>(chunks[i].tokens.begin(), chunks[i].tokens.end()));
    EXPECT_EQ(std::vector<PageId>(got.pages.begin(), got.pages.end()),
              std::vector<PageId>(chunks[i].pages.begin(), chunks[i].pages.end()));
    EXPECT_EQ(got.start, chunks[i].start);
    EXPECT_EQ(got.want_logits, chunks[i].want_logits);
    if (got.want_logits) {
      EXPECT_EQ(got.logit_rows, chunks[i].logit_rows);
    }
  }
  EXPECT_TRUE(DecodeStep(EncodeStep({})).ok());
}

TEST(StepMessageTest, BytesAreLittleEndianWithNoPadding) {
  const std::vector<int32_t> tokens = {0x01020304};
  const std::vector<PageId> pages = {2};
  const std::vector<SequenceChunk> chunks = {
      {.tokens = tokens, .start = 0x0102, .pages = pages, .want_logits = true}};
  EXPECT_EQ(EncodeStep(chunks),
            "\x00"s                              // a forward pass
            "\x01\x00\x00\x00"s                  // one chunk
            "\x02\x01\x00\x00\x00\x00\x00\x00"s  // start
            "\x01\x00\x00\x00\x01\x00\x00\x00"s  // 1 token, 1 page
            "\x01"s                              // logit rows
            "\x00\x00\x00\x00\x00\x00\x00\x00"s  // no MTP entries, no hidden rows
            "\x04\x03\x02\x01\x02\x00\x00\x00"s);
}

TEST(StepMessageTest, TruncatedPaddedOrNegativeMessagesAreRefused) {
  const std::vector<int32_t> tokens = {1, 2};
  const std::vector<PageId> pages = {0};
  const std::vector<SequenceChunk> chunks = {
      {.tokens = tokens, .start = 0, .pages = pages, .want_logits = false}};
  const std::string bytes = EncodeStep(chunks);

  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_EQ(DecodeStep(bytes.substr(0, n)).status().code(), StatusCode::kProtocolError) << n;
  }
  EXPECT_EQ(DecodeStep(bytes + "\0"s).status().code(), StatusCode::kProtocolError);
  // A count of chunks the bytes cannot hold allocates nothing.
  EXPECT_EQ(DecodeStep("\x00\xff\xff\xff\xff"s + bytes.substr(5)).status().code(),
            StatusCode::kProtocolError);

  std::string negative = bytes;
  negative[negative.size() - 1] = '\x80';  // the page id's top bit
  const Status s = DecodeStep(negative).status();
  EXPECT_EQ(s.code(), StatusCode::kProtocolError);
  EXPECT_NE(s.message().find("step message"), std::string::npos) << s.message();

  std::string bad_flag = bytes;
  bad_flag[1 + 4 + 16] = '\x03';  // logit rows: more than the chunk's 2 tokens
  EXPECT_EQ(DecodeStep(bad_flag).status().code(), StatusCode::kProtocolError);
  std::string bad_kind = bytes;
  bad_kind[0] = '\x02';
  EXPECT_EQ(DecodeStep(bad_kind).status().code(), StatusCode::kProtocolError);
  // A forward pass carries no hidden states.
  EXPECT_EQ(DecodeStep(bytes + "\0\0\0\0"s).status().code(), StatusCode::kProtocolError);
}

// The MTP parts: a forward pass's MTP entries and hidden rows, and a drafting pass's hidden
// states, whole rows only.
TEST(StepMessageTest, MtpEntriesAndHiddenStatesReadBack) {
  const std::vector<int32_t> tokens = {5, 6, 7}, next = {6, 7};
  const std::vector<PageId> pages = {1};
  const std::vector<SequenceChunk> forward = {{.tokens = tokens,
                                               .start = 4,
                                               .pages = pages,
                                               .want_logits = true,
                                               .logit_rows = 3,
                                               .mtp_tokens = next,
                                               .hidden_rows = 3}};
  Result<DecodedStep> step = DecodeStep(EncodeStep(forward));
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  EXPECT_EQ(step->kind, StepKind::kForward);
  ASSERT_EQ(step->chunks.size(), 1u);
  EXPECT_EQ(std::vector<int32_t>(step->chunks[0].tokens.begin(), step->chunks[0].tokens.end()),
            tokens);
  EXPECT_EQ(
      std::vector<int32_t>(step->chunks[0].mtp_tokens.begin(), step->chunks[0].mtp_tokens.end()),
      next);
  EXPECT_EQ(step->chunks[0].hidden_rows, 3);
  EXPECT_TRUE(step->hidden.empty());

  const std::vector<int32_t> one_a = {9}, one_b = {10};
  const std::vector<SequenceChunk> draft = {
      {.tokens = one_a, .start = 7, .pages = pages, .want_logits = true},
      {.tokens = one_b, .start = 2, .pages = pages, .want_logits = true}};
  const std::vector<float> hidden = {0.5f, -1.0f, 2.0f, 3.25f, 1e-3f, -7.0f};  // 2 rows of 3
  const std::string bytes = EncodeStep(draft, StepKind::kMtpDraft, hidden);
  step = DecodeStep(bytes);
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  EXPECT_EQ(step->kind, StepKind::kMtpDraft);
  EXPECT_EQ(step->hidden, hidden);
  ASSERT_EQ(step->chunks.size(), 2u);
  EXPECT_EQ(step->chunks[1].tokens[0], 10);
  EXPECT_EQ(step->chunks[1].start, 2);
  // Part of a row, or a row's bytes cut, is refused.
  EXPECT_EQ(DecodeStep(bytes.substr(0, bytes.size() - 4)).status().code(),
            StatusCode::kProtocolError);
  EXPECT_EQ(DecodeStep(bytes.substr(0, bytes.size() - 1)).status().code(),
            StatusCode::kProtocolError);
}

}  // namespace
}  // namespace pdserve
