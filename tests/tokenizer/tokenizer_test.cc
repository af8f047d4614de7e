// Tokenizer pieces that need no shared data: UTF-8 helpers, NFC, IncrementalDecoder, and
// Tokenizer::Load on malformed files (clear errors, never a crash).
#include "tokenizer/tokenizer.h"

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "testing/test_paths.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/nfc.h"
#include "tokenizer/utf8.h"

namespace pdserve {
namespace {

using nlohmann::json;

TEST(Utf8Test, DecodesAndClassifiesSequences) {
  const utf8::Decoded euro = utf8::DecodeAt("\xE2\x82\xAC", 0);
  EXPECT_EQ(euro.kind, utf8::Decoded::Kind::kValid);
  EXPECT_EQ(euro.cp, U'\u20AC');
  EXPECT_EQ(euro.length, 3u);
  EXPECT_EQ(utf8::DecodeAt("\xE2\x82", 0).kind, utf8::Decoded::Kind::kIncomplete);
  EXPECT_EQ(utf8::DecodeAt("\xE2\x41", 0).kind, utf8::Decoded::Kind::kInvalid);
  EXPECT_EQ(utf8::DecodeAt("\xC0\xAF", 0).kind, utf8::Decoded::Kind::kInvalid);      // overlong
  EXPECT_EQ(utf8::DecodeAt("\xED\xA0\x80", 0).kind, utf8::Decoded::Kind::kInvalid);  // surrogate
  EXPECT_EQ(utf8::DecodeAt("\xF4\x90\x80\x80", 0).kind, utf8::Decoded::Kind::kInvalid);
  EXPECT_TRUE(utf8::IsValid("plain \xF0\x9F\xA6\x99"));
  EXPECT_FALSE(utf8::IsValid("cut \xF0\x9F\xA6"));
  // Each maximal invalid subpart becomes one U+FFFD, as Python and Rust decoders do.
  EXPECT_EQ(utf8::Sanitize("a\xF0\x9F\xA6z\xFF"), "a\xEF\xBF\xBDz\xEF\xBF\xBD");
}

TEST(NfcTest, ComposesReordersAndKeepsExclusions) {
  EXPECT_EQ(nfc::Normalize("e\xCC\x81"), "\xC3\xA9");                                 // e + acute
  EXPECT_EQ(nfc::Normalize("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"), "\xEA\xB0\x81");  // Hangul
  EXPECT_EQ(nfc::Normalize("a\xCC\x82\xCC\xA3"), "\xE1\xBA\xAD");  // marks in either order
  EXPECT_EQ(nfc::Normalize("a\xCC\xA3\xCC\x82"), "\xE1\xBA\xAD");
  EXPECT_EQ(nfc::Normalize("\xE2\x84\xAB"), "\xC3\x85");  // ANGSTROM SIGN is a singleton
  // DEVANAGARI QA is a composition exclusion: it stays decomposed.
  EXPECT_EQ(nfc::Normalize("\xE0\xA5\x98"), "\xE0\xA4\x95\xE0\xA4\xBC");
  EXPECT_EQ(nfc::Normalize("q\xCC\x87\xCC\xA3"), "q\xCC\xA3\xCC\x87");  // reorder only
  EXPECT_TRUE(nfc::IsQuickNfc("plain ASCII and caf\xC3\xA9"));
  EXPECT_FALSE(nfc::IsQuickNfc("cafe\xCC\x81"));
}

// A small synthetic tokenizer whose ids 0..255 are the single bytes in order.
class IncrementalDecoderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("pd_incr_tok_");
    ASSERT_TRUE(WriteSyntheticTokenizer(dir_, 300, 1).ok());
    auto loaded = Tokenizer::Load(dir_);
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    tokenizer_ = std::move(loaded).value();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(IncrementalDecoderTest, HoldsBackPartialCharactersUntilComplete) {
  ASSERT_EQ(tokenizer_->TokenBytes(0xE2), "\xE2");
  IncrementalDecoder decoder(tokenizer_.get(), /*skip_special=*/true);
  EXPECT_EQ(decoder.Append('a'), "a");
  EXPECT_EQ(decoder.Append(0xE2), "");
  EXPECT_EQ(decoder.Append(0x82), "");
  EXPECT_EQ(decoder.Append(0xAC), "\xE2\x82\xAC");
  EXPECT_EQ(decoder.Append(0xF0), "");
  EXPECT_EQ(decoder.Append(0x9F), "");
  EXPECT_EQ(decoder.Append(0xA6), "");
  EXPECT_EQ(decoder.Append(0x99), "\xF0\x9F\xA6\x99");
  EXPECT_EQ(decoder.Flush(), "");
}

TEST_F(IncrementalDecoderTest, ReplacesInvalidBytesAndSkipsSpecials) {
  IncrementalDecoder decoder(tokenizer_.get(), /*skip_special=*/true);
  EXPECT_EQ(decoder.Append(0xE2), "");
  EXPECT_EQ(decoder.Append('A'),
            "\xEF\xBF\xBD"
            "A");  // the cut-off character is replaced
  EXPECT_EQ(decoder.Append(0xFF), "\xEF\xBF\xBD");
  EXPECT_EQ(decoder.Append(*tokenizer_->bos_id()), "");  // special, skipped
  EXPECT_EQ(decoder.Append(-5), "");                     // out of range, skipped
  EXPECT_EQ(decoder.Append(1 << 30), "");
  EXPECT_EQ(decoder.Append(0xC3), "");
  EXPECT_EQ(decoder.Flush(), "\xEF\xBF\xBD");  // held-back tail at the end
  IncrementalDecoder keep(tokenizer_.get(), /*skip_special=*/false);
  EXPECT_EQ(keep.Append(*tokenizer_->bos_id()), "<|begin_of_text|>");
}

TEST_F(IncrementalDecoderTest, StreamsTheSameTextAsDecode) {
  const std::string text = "Streaming 日本語 and 🦙🦙 with ça va? ok";
  const std::vector<int32_t> ids = tokenizer_->Encode(text, true);
  IncrementalDecoder decoder(tokenizer_.get(), true);
  std::string streamed;
  for (int32_t id : ids) streamed += decoder.Append(id);
  streamed += decoder.Flush();
  EXPECT_EQ(streamed, text);
  EXPECT_EQ(tokenizer_->Decode(ids, true), text);
}

TEST_F(IncrementalDecoderTest, EncodeIsSafeFromManyThreads) {
  // Encode shares a word cache between threads; results must not depend on interleaving.
  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i) {
    texts.push_back("thread text " + std::to_string(i * 7919) + " with words " +
                    std::string(static_cast<size_t>(i % 5), 'x') + " \xC3\xA9t\xC3\xA9");
  }
  std::vector<std::vector<int32_t>> expected;
  for (const auto& t : texts) expected.push_back(tokenizer_->Encode(t, false));
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 50; ++round) {
        const size_t i = static_cast<size_t>((round * 4 + t) % texts.size());
        if (tokenizer_->Encode(texts[i], false) != expected[i]) ++mismatches;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(mismatches.load(), 0);
}

// Malformed files: each variant of a minimal valid tokenizer.json must fail with a message
// naming the file and the faulty part.
class MalformedTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::MakeTempDir("pd_bad_tok_"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  static json ValidFile() {
    json vocab = json::object();
    for (int b = 0; b < 256; ++b) vocab[byte_level::Encode(std::string(1, char(b)))] = b;
    vocab["\xC4\xA0t"] = 256;  // "Ġt"
    return {
        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({"\xC4\xA0 t"})}}},
        {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
        {"decoder", {{"type", "ByteLevel"}}},
        {"added_tokens", json::array({{{"id", 257}, {"content", "<eos>"}, {"special", true}}})}};
  }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ + "/" + name, std::ios::binary) << text;
  }
  // Loads and returns the error (or "OK").
  Status LoadStatus() {
    auto tokenizer = Tokenizer::Load(dir_);
    return tokenizer.ok() ? Status::Ok() : tokenizer.status();
  }
  void ExpectError(const json& file, const std::string& needle) {
    Write("tokenizer.json", file.dump());
    const Status status = LoadStatus();
    EXPECT_FALSE(status.ok()) << "accepted a file with: " << needle;
    EXPECT_NE(status.message().find(needle), std::string::npos) << status.ToString();
    EXPECT_NE(status.message().find("tokenizer.json"), std::string::npos) << status.ToString();
  }
  std::string dir_;
};

TEST_F(MalformedTokenizerTest, ValidBaselineLoads) {
  Write("tokenizer.json", ValidFile().dump());
  Write("tokenizer_config.json", R"({"eos_token": "<eos>"})");
  auto tokenizer = Tokenizer::Load(dir_);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  EXPECT_EQ((*tokenizer)->vocab_size(), 258);
  EXPECT_EQ((*tokenizer)->Encode(" t<eos>", false), (std::vector<int32_t>{256, 257}));
  EXPECT_EQ((*tokenizer)->eos_ids(), std::vector<int32_t>{257});
}

TEST_F(MalformedTokenizerTest, TruncatedOrEmptyFile) {
  const std::string text = ValidFile().dump();
  Write("tokenizer.json", text.substr(0, text.size() / 2));
  Status status = LoadStatus();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("tokenizer.json"), std::string::npos);
  EXPECT_NE(status.message().find("not valid JSON"), std::string::npos);
  Write("tokenizer.json", "");
  EXPECT_EQ(LoadStatus().code(), StatusCode::kInvalidArgument);
}

TEST_F(MalformedTokenizerTest, WrongTypesAndMissingParts) {
  json f = ValidFile();
  f.erase("model");
  ExpectError(f, "model");
  f = ValidFile();
  f["model"]["vocab"] = json::array({1, 2});
  ExpectError(f, "model.vocab");
  f = ValidFile();
  f["model"]["vocab"]["!"] = "zero";
  ExpectError(f, "model.vocab[\"!\"]");
  f = ValidFile();
  f["model"]["merges"] = json::array({42});
  ExpectError(f, "model.merges[0]");
  f = ValidFile();
  f["model"]["merges"] = json::array({"\xC4\xA0 q"});  // "Ġq" is not in the vocabulary
  ExpectError(f, "model.merges[0]");
  f = ValidFile();
  f["added_tokens"][0]["id"] = "257";
  ExpectError(f, "added_tokens[0]");
  f = ValidFile();
  f["pre_tokenizer"] = {
      {"type", "Split"}, {"behavior", "Isolated"}, {"pattern", {{"Regex", "(["}}}};
  ExpectError(f, "regex");
  f = ValidFile();
  f["pre_tokenizer"] = {{"type", "Whitespace"}};
  ExpectError(f, "Whitespace");
  f = ValidFile();
  f["normalizer"] = {{"type", "Lowercase"}};
  ExpectError(f, "Lowercase");
  f = ValidFile();
  f["model"]["vocab"].erase("a");
  ExpectError(f, "byte");
  ExpectError(json::array({1, 2, 3}), "object");
}

TEST_F(MalformedTokenizerTest, MissingFilesAndBadConfigs) {
  Status status = LoadStatus();
  EXPECT_EQ(status.code(), StatusCode::kNotFound);
  EXPECT_NE(status.message().find("tokenizer.json or tokenizer.model"), std::string::npos);
  Write("tokenizer.json", ValidFile().dump());
  Write("tokenizer_config.json", "{\"bos_token\": ");
  status = LoadStatus();
  EXPECT_NE(status.message().find("tokenizer_config.json"), std::string::npos) << status.ToString();
  Write("tokenizer_config.json", R"({"eos_token_id": 999999})");
  status = LoadStatus();
  EXPECT_NE(status.message().find("eos_token_id"), std::string::npos) << status.ToString();
  Write("tokenizer_config.json", "{}");
  Write("generation_config.json", R"({"eos_token_id": ["x"]})");
  status = LoadStatus();
  EXPECT_NE(status.message().find("generation_config.json"), std::string::npos)
      << status.ToString();
}

TEST_F(MalformedTokenizerTest, SurvivesRandomMutations) {
  // Replace one random node of the valid file by a value of a random type, or cut the text
  // at a random point: Load either fails cleanly or yields a tokenizer that works.
  std::mt19937 rng(42);
  const json replacements[] = {
      nullptr, -1, 1 << 30, "x", json::array(), json::object(), 3.5, true, json::array({"a", 1})};
  for (int trial = 0; trial < 150; ++trial) {
    json f = ValidFile();
    std::vector<json*> nodes;
    std::vector<json*> todo{&f};
    while (!todo.empty()) {
      json* node = todo.back();
      todo.pop_back();
      nodes.push_back(node);
      if (node->is_structured() && node->size() < 20) {
        for (auto& child : *node) todo.push_back(&child);
      }
    }
    *nodes[rng() % nodes.size()] = replacements[rng() % std::size(replacements)];
    std::string text = f.dump();
    if (trial % 5 == 0) text.resize(rng() % text.size());
    Write("tokenizer.json", text);
    auto tokenizer = Tokenizer::Load(dir_);
    if (!tokenizer.ok()) {
      EXPECT_FALSE(tokenizer.status().message().empty());
      continue;
    }
    const std::vector<int32_t> ids = (*tokenizer)->Encode(" the <eos> text \xFF", true);
    for (int32_t id : ids) EXPECT_LT(id, (*tokenizer)->vocab_size());
    (void)(*tokenizer)->Decode(ids, false);
  }
}

TEST_F(MalformedTokenizerTest, RejectsSparseHugeIds) {
  json f = ValidFile();
  f["added_tokens"][0]["id"] = 10000000;
  ExpectError(f, "not dense");
}

TEST_F(MalformedTokenizerTest, CorruptSentencePieceModel) {
  Write("tokenizer.model", std::string("\x0a\x05<unk>\x15", 8));
  const Status status = LoadStatus();
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("tokenizer.model"), std::string::npos) << status.ToString();
}

}  // namespace
}  // namespace pdserve
