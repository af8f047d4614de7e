#include "model/safetensors.h"

#include <cstring>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "loader_test_util.h"
#include "testing/test_paths.h"

namespace pdserve {
namespace {

using pdserve::testing::Mentions;
using pdserve::testing::ScopedTempDir;

// Writes a file by hand: an 8-byte little-endian length (header.size() unless overridden),
// the header text, then `data_bytes` bytes of 0x11.
void WriteRaw(const std::string& path, const std::string& header, size_t data_bytes,
              std::optional<uint64_t> header_len = std::nullopt) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  uint64_t len = header_len.value_or(header.size());
  char le[8];
  for (int i = 0; i < 8; ++i) le[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  out.write(le, 8);
  out << header;
  out << std::string(data_bytes, '\x11');
}

// Opens a folder holding one hand-written model.safetensors.
Result<std::unique_ptr<SafetensorsSet>> OpenRaw(const std::string& header, size_t data_bytes) {
  ScopedTempDir tmp("pd_st_");
  WriteRaw(tmp.path() + "/model.safetensors", header, data_bytes);
  // The set keeps its mapping after the folder is removed (Linux unlink semantics).
  return SafetensorsSet::Open(tmp.path());
}

class SafetensorsRoundTrip : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 15; ++i) f32_.push_back(0.5f * static_cast<float>(i) - 3.0f);
    for (int i = 0; i < 7; ++i) bf16_.push_back(F32ToBF16(static_cast<float>(i) * 1.25f));
    for (int i = 0; i < 6; ++i) f16_.push_back(F32ToF16(static_cast<float>(-i) * 0.5f));
  }
  std::vector<TensorToWrite> Tensors() const {
    // Odd-sized 16-bit tensors first: the writer must still align the F32 one.
    return {{"b.bf16", DType::kBF16, {7}, bf16_.data()},
            {"c.f16", DType::kF16, {2, 3}, f16_.data()},
            {"a.f32", DType::kF32, {3, 5}, f32_.data()},
            {"empty", DType::kF32, {0, 4}, nullptr}};
  }
  ScopedTempDir tmp_{"pd_st_"};
  const std::string dir_ = tmp_.path();
  std::vector<float> f32_;
  std::vector<uint16_t> bf16_, f16_;
};

TEST_F(SafetensorsRoundTrip, WritesAndReadsBack) {
  ASSERT_TRUE(WriteSafetensors(dir_ + "/model.safetensors", Tensors()).ok());
  auto set = SafetensorsSet::Open(dir_);
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ((*set)->Names(), (std::vector<std::string>{"a.f32", "b.bf16", "c.f16", "empty"}));

  auto a = (*set)->FindWithShape("a.f32", {3, 5});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->dtype, DType::kF32);
  EXPECT_EQ(a->numel(), 15);
  EXPECT_EQ(a->nbytes, 60u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data) % 4, 0u);
  EXPECT_EQ(std::memcmp(a->data, f32_.data(), 60), 0);
  EXPECT_EQ(a->file, dir_ + "/model.safetensors");

  auto b = (*set)->Find("b.bf16");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->dtype, DType::kBF16);
  EXPECT_EQ(b->shape, std::vector<int64_t>{7});
  EXPECT_EQ(std::memcmp(b->data, bf16_.data(), 14), 0);

  auto c = (*set)->Find("c.f16");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->dtype, DType::kF16);
  EXPECT_EQ(std::memcmp(c->data, f16_.data(), 12), 0);

  auto e = (*set)->Find("empty");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->numel(), 0);
  EXPECT_TRUE((*set)->Has("empty"));
  EXPECT_FALSE((*set)->Has("missing"));
}

TEST_F(SafetensorsRoundTrip, HeaderIsPaddedAndSpecConformant) {
  const std::string path = dir_ + "/model.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, Tensors()).ok());
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = (len << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ(len % 8, 0u);
  auto header = nlohmann::json::parse(bytes.substr(8, len));
  EXPECT_EQ(header["a.f32"]["dtype"], "F32");
  EXPECT_EQ(header["a.f32"]["data_offsets"][0], 0);  // widest first
  // Offsets cover the data exactly, with no holes (as the reference reader demands).
  EXPECT_EQ(bytes.size(), 8 + len + 60 + 14 + 12);
}

TEST_F(SafetensorsRoundTrip, MissingTensorAndWrongShapeAreNamed) {
  ASSERT_TRUE(WriteSafetensors(dir_ + "/model.safetensors", Tensors()).ok());
  auto set = SafetensorsSet::Open(dir_);
  ASSERT_TRUE(set.ok());
  auto missing = (*set)->Find("model.norm.weight");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Mentions(missing.status().message(), "model.norm.weight"));
  EXPECT_TRUE(Mentions(missing.status().message(), dir_));
  auto wrong = (*set)->FindWithShape("a.f32", {5, 3});
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(wrong.status().message(), "a.f32"));
  EXPECT_TRUE(Mentions(wrong.status().message(), "[3, 5]"));
  EXPECT_TRUE(Mentions(wrong.status().message(), "[5, 3]"));
  EXPECT_TRUE(Mentions(wrong.status().message(), "model.safetensors"));
}

TEST_F(SafetensorsRoundTrip, TruncatedFileIsDataLossNamingFileAndTensor) {
  const std::string path = dir_ + "/model.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, Tensors()).ok());
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 3);
  auto set = SafetensorsSet::Open(dir_);
  ASSERT_FALSE(set.ok());
  EXPECT_EQ(set.status().code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Mentions(set.status().message(), path));
  EXPECT_TRUE(Mentions(set.status().message(), "c.f16"));  // the last tensor in the file
  EXPECT_TRUE(Mentions(set.status().message(), "truncated"));
}

TEST_F(SafetensorsRoundTrip, StreamedWriterPropagatesFillErrors) {
  const std::string path = dir_ + "/model.safetensors";
  Status s = WriteSafetensorsStreamed(path, Tensors(),
                                      [](size_t, void*) { return Status::Cancelled("stop"); });
  EXPECT_EQ(s.code(), StatusCode::kCancelled);
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(SafetensorsTest, ShortFileIsDataLoss) {
  ScopedTempDir tmp("pd_st_");
  const std::string& dir = tmp.path();
  std::ofstream(dir + "/model.safetensors") << "abc";
  auto set = SafetensorsSet::Open(dir);
  ASSERT_FALSE(set.ok());
  EXPECT_EQ(set.status().code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Mentions(set.status().message(), dir + "/model.safetensors"));
}

TEST(SafetensorsTest, HeaderLengthBeyondFileIsDataLoss) {
  ScopedTempDir tmp("pd_st_");
  const std::string& dir = tmp.path();
  WriteRaw(dir + "/model.safetensors", "{}", 0, 4096);
  auto set = SafetensorsSet::Open(dir);
  ASSERT_FALSE(set.ok());
  EXPECT_EQ(set.status().code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Mentions(set.status().message(), "4096"));
  EXPECT_TRUE(Mentions(set.status().message(), "model.safetensors"));
  // An absurd length (a random or text file) is refused before anything is read.
  WriteRaw(dir + "/model.safetensors", "{}", 0, uint64_t{1} << 60);
  set = SafetensorsSet::Open(dir);
  ASSERT_FALSE(set.ok());
  EXPECT_EQ(set.status().code(), StatusCode::kDataLoss);
}

TEST(SafetensorsTest, UnsupportedDtypeNamesTensor) {
  auto set = OpenRaw(R"({"pos_ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})", 16);
  ASSERT_FALSE(set.ok());
  EXPECT_EQ(set.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(set.status().message(), "pos_ids"));
  EXPECT_TRUE(Mentions(set.status().message(), "I64"));
  EXPECT_TRUE(Mentions(set.status().message(), "model.safetensors"));
}

TEST(SafetensorsTest, OffsetsOutOfRangeOrInconsistent) {
  const std::pair<const char*, size_t> cases[] = {
      // Past the end of the data.
      {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8},
      // Size does not match shape.
      {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,12]}})", 16},
      // end < begin.
      {R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", 16},
      // Negative offset.
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 16},
      // Misaligned for F32: the header is padded to 64 bytes, so the data starts at file
      // offset 72 and the tensor at 74.
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}}          )", 16},
  };
  for (const auto& [header, data] : cases) {
    auto set = OpenRaw(header, data);
    ASSERT_FALSE(set.ok()) << header;
    EXPECT_EQ(set.status().code(), StatusCode::kDataLoss) << header;
    EXPECT_TRUE(Mentions(set.status().message(), "'w'")) << header;
  }
}

TEST(SafetensorsTest, OverlappingTensorsAreDataLoss) {
  auto set = OpenRaw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                     R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                     16);
  ASSERT_FALSE(set.ok());
  EXPECT_EQ(set.status().code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Mentions(set.status().message(), "overlap"));
}

TEST(SafetensorsTest, BadJsonAndBadEntriesAreDataLoss) {
  for (const char* header : {"{not json", "[1,2,3]", R"({"w": 5})", R"({"w": {"dtype": "F32"}})",
                             R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})",
                             R"({"w":{"dtype":"F32","shape":"x","data_offsets":[0,0]}})"}) {
    auto set = OpenRaw(header, 0);
    ASSERT_FALSE(set.ok()) << header;
    EXPECT_EQ(set.status().code(), StatusCode::kDataLoss) << header;
    EXPECT_TRUE(Mentions(set.status().message(), "/model.safetensors"));
  }
}

TEST(SafetensorsTest, MetadataIsSkipped) {
  auto set = OpenRaw(R"({"__metadata__":{"format":"pt"},)"
                     R"("w":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}})",
                     8);
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ((*set)->Names(), std::vector<std::string>{"w"});
}

TEST(SafetensorsTest, EmptyOrMissingDirectoryIsNotFound) {
  ScopedTempDir tmp("pd_st_");
  const std::string& dir = tmp.path();
  auto set = SafetensorsSet::Open(dir);
  ASSERT_FALSE(set.ok());
  EXPECT_EQ(set.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Mentions(set.status().message(), dir));
  set = SafetensorsSet::Open(dir + "/nope");
  ASSERT_FALSE(set.ok());
  EXPECT_EQ(set.status().code(), StatusCode::kNotFound);
}

// Two shards: one tensor each.
class ShardedSet : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(
        WriteSafetensors(dir_ + "/model-00001-of-00002.safetensors", {{"x", DType::kF32, {2}, x_}})
            .ok());
    ASSERT_TRUE(
        WriteSafetensors(dir_ + "/model-00002-of-00002.safetensors", {{"y", DType::kF32, {2}, y_}})
            .ok());
  }
  void WriteIndex(const nlohmann::json& weight_map) {
    nlohmann::json j = {{"metadata", {{"total_size", 16}}}, {"weight_map", weight_map}};
    std::ofstream(dir_ + "/model.safetensors.index.json") << j.dump();
  }
  ScopedTempDir tmp_{"pd_st_"};
  const std::string dir_ = tmp_.path();
  float x_[2] = {1, 2};
  float y_[2] = {3, 4};
};

TEST_F(ShardedSet, ReadsEveryFileWithoutIndex) {
  auto set = SafetensorsSet::Open(dir_);
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  auto y = (*set)->Find("y");
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(static_cast<const float*>(y->data)[1], 4.0f);
  EXPECT_TRUE(Mentions(y->file, "model-00002-of-00002.safetensors"));
}

TEST_F(ShardedSet, FollowsIndexWeightMap) {
  // A stray file the index does not name is not read.
  std::ofstream(dir_ + "/junk.safetensors") << "garbage";
  WriteIndex(
      {{"x", "model-00001-of-00002.safetensors"}, {"y", "model-00002-of-00002.safetensors"}});
  auto set = SafetensorsSet::Open(dir_);
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ((*set)->Names(), (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(static_cast<const float*>((*set)->Find("x")->data)[0], 1.0f);
}

TEST_F(ShardedSet, IndexErrorsAreNamed) {
  WriteIndex(
      {{"x", "model-00002-of-00002.safetensors"}, {"y", "model-00002-of-00002.safetensors"}});
  auto set = SafetensorsSet::Open(dir_);
  ASSERT_FALSE(set.ok());
  EXPECT_TRUE(Mentions(set.status().message(), "'x'"));

  WriteIndex({{"x", "model-00003-of-00002.safetensors"}});
  set = SafetensorsSet::Open(dir_);
  ASSERT_FALSE(set.ok());
  EXPECT_EQ(set.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Mentions(set.status().message(), "model-00003-of-00002.safetensors"));

  WriteIndex({{"x", "../elsewhere.safetensors"}});
  set = SafetensorsSet::Open(dir_);
  ASSERT_FALSE(set.ok());
  EXPECT_EQ(set.status().code(), StatusCode::kDataLoss);

  std::ofstream(dir_ + "/model.safetensors.index.json", std::ios::trunc) << "{\"weight_map\": 3}";
  set = SafetensorsSet::Open(dir_);
  ASSERT_FALSE(set.ok());
  EXPECT_TRUE(Mentions(set.status().message(), "model.safetensors.index.json"));
}

TEST_F(ShardedSet, DuplicateTensorAcrossFilesIsAnError) {
  ASSERT_TRUE(WriteSafetensors(dir_ + "/extra.safetensors", {{"x", DType::kF32, {2}, x_}}).ok());
  auto set = SafetensorsSet::Open(dir_);
  ASSERT_FALSE(set.ok());
  EXPECT_TRUE(Mentions(set.status().message(), "'x'"));
}

}  // namespace
}  // namespace pdserve
