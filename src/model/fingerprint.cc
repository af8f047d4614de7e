#include "model/fingerprint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "common/dtype.h"
#include "common/sha256.h"
#include "model/weights.h"

namespace pdserve {
namespace {

constexpr int kSamples = 16;
constexpr size_t kSampleBytes = 4096;

Status HashFileSamples(const std::filesystem::path& file, Sha256& hash) {
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(file, ec);
  if (ec) return Status::IoError(fmt::format("cannot stat {}: {}", file.string(), ec.message()));
  std::ifstream in(file, std::ios::binary);
  if (!in) return Status::IoError("cannot open " + file.string());
  hash.Update(fmt::format("{}:{};", file.filename().string(), size));
  std::vector<char> buf(kSampleBytes);
  for (int i = 0; i < kSamples; ++i) {
    const uintmax_t span = size > kSampleBytes ? size - kSampleBytes : 0;
    const uintmax_t offset = span * static_cast<uintmax_t>(i) / (kSamples - 1);
    const size_t n = static_cast<size_t>(std::min<uintmax_t>(kSampleBytes, size - offset));
    in.seekg(static_cast<std::streamoff>(offset));
    if (!in.read(buf.data(), static_cast<std::streamsize>(n))) {
      return Status::IoError("cannot read " + file.string());
    }
    hash.Update(std::string_view(buf.data(), n));
  }
  return Status::Ok();
}

}  // namespace

Result<std::string> ModelFingerprint(const std::string& model_dir, const ModelConfig& config) {
  Sha256 hash;
  hash.Update(fmt::format("config:{:016x};", config.Fingerprint()));
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(model_dir, ec)) {
    if (entry.path().extension() == ".safetensors") files.push_back(entry.path());
  }
  if (ec) return Status::IoError(fmt::format("cannot list {}: {}", model_dir, ec.message()));
  std::sort(files.begin(), files.end());
  for (const auto& f : files) PD_RETURN_IF_ERROR(HashFileSamples(f, hash));
  const Sha256Digest digest = hash.Finish();
  std::string hex;
  for (size_t i = 0; i < 16; ++i) hex += fmt::format("{:02x}", digest[i]);
  return hex;
}

std::string WeightsIdentity(DType matrix_dtype, DType linear_dtype) {
  std::string identity(DTypeFlagName(matrix_dtype));
  if (IsBlockScaled(linear_dtype)) identity += "/" + std::string(DTypeFlagName(linear_dtype));
  return identity;
}

Result<ModelIdentity> IdentifyModel(const std::string& model_dir, const ModelConfig& config,
                                    std::string weight_dtype) {
  PD_ASSIGN_OR_RETURN(std::string files, ModelFingerprint(model_dir, config));
  return ModelIdentity{.config = config.Fingerprint(),
                       .files = std::move(files),
                       .weights = std::move(weight_dtype)};
}

}  // namespace pdserve
