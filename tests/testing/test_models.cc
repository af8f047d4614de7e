#include "testing/test_models.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "model/safetensors.h"
#include "model/synthetic.h"
#include "testing/test_paths.h"

namespace pdserve::testing {

namespace {

// Bump when the synthetic writer writes other tensors or values for an unchanged config.
constexpr int kWriterRevision = 3;  // 3: FP8 quantised from the BF16 values

// A short hash of what the writer makes of `preset`: a directory written by a build whose
// preset (config.json) or writer differed is not reused.
std::string PresetVersion(const std::string& preset) {
  Result<ModelConfig> config = SyntheticPresetConfig(preset);
  const std::string text =
      (config.ok() ? config->ToJson() : preset) + std::to_string(kWriterRevision);
  uint32_t h = 2166136261u;  // FNV-1a
  for (unsigned char ch : text) h = (h ^ ch) * 16777619u;
  char hex[9];
  std::snprintf(hex, sizeof(hex), "%08x", h);
  return hex;
}

}  // namespace

std::string SyntheticModelDir(const std::string& preset, DType dtype) {
  return SyntheticModelDir(preset, dtype, SyntheticVariant{});
}

std::string SyntheticModelDir(const std::string& preset, const SyntheticVariant& variant) {
  return SyntheticModelDir(preset, DType::kBF16, variant);
}

std::string SyntheticModelDir(const std::string& preset, DType dtype,
                              const SyntheticVariant& variant) {
  namespace fs = std::filesystem;
  const std::string name = variant.empty() ? preset : preset + "-" + variant.Name();
  const std::string dir = BinaryPath("test-models/" + name + "-" + std::string(DTypeName(dtype)) +
                                     "-" + PresetVersion(preset));
  if (fs::exists(dir + "/config.json")) return dir;
  fs::create_directories(BinaryPath("test-models"));
  const std::string tmp = dir + ".tmp." + std::to_string(getpid());
  fs::remove_all(tmp);
  Status s = WriteSyntheticModel(preset, tmp, /*seed=*/1, dtype, variant);
  EXPECT_TRUE(s.ok()) << s.ToString();
  std::error_code ec;
  fs::rename(tmp, dir, ec);  // fails harmlessly if another process got there first
  if (ec) fs::remove_all(tmp);
  return dir;
}

void CopyModelDir(const std::string& src, const std::string& dst,
                  const std::function<void(ModelConfig&)>& edit_config,
                  const TensorEdit& edit_tensor) {
  namespace fs = std::filesystem;
  fs::create_directories(dst);
  for (const auto& entry : fs::directory_iterator(src)) {
    const std::string name = entry.path().filename();
    if (entry.path().extension() == ".safetensors" || name == "model.safetensors.index.json" ||
        name == "config.json") {
      continue;
    }
    fs::copy(entry.path(), dst + "/" + name, fs::copy_options::overwrite_existing);
  }
  Result<ModelConfig> config = ModelConfig::Load(src);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  edit_config(*config);
  {
    std::ofstream out(dst + "/config.json", std::ios::trunc);
    out << config->ToJson();
    ASSERT_TRUE(out.good());
  }
  auto set = SafetensorsSet::Open(src);
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  std::vector<std::string> names;
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<TensorView> views;
  for (const std::string& name : (*set)->Names()) {
    const TensorView view = *(*set)->Find(name);
    const auto* data = static_cast<const uint8_t*>(view.data);
    std::vector<uint8_t> b(data, data + view.nbytes);
    if (!edit_tensor(name, b)) continue;
    ASSERT_EQ(b.size(), view.nbytes) << name;
    names.push_back(name);
    bytes.push_back(std::move(b));
    views.push_back(view);
  }
  std::vector<TensorToWrite> tensors;
  for (size_t i = 0; i < names.size(); ++i) {
    tensors.push_back({names[i], views[i].dtype, views[i].shape, bytes[i].data()});
  }
  Status s = WriteSafetensors(dst + "/model.safetensors", tensors);
  ASSERT_TRUE(s.ok()) << s.ToString();
}

}  // namespace pdserve::testing
