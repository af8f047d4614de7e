#include "testing/test_models.h"

#include <unistd.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "model/synthetic.h"
#include "testing/test_paths.h"

namespace pdserve::testing {

std::string SyntheticModelDir(const std::string& preset, DType dtype) {
  namespace fs = std::filesystem;
  const std::string dir = BinaryPath("test-models/" + preset + "-" + std::string(DTypeName(dtype)));
  if (fs::exists(dir + "/config.json")) return dir;
  fs::create_directories(BinaryPath("test-models"));
  const std::string tmp = dir + ".tmp." + std::to_string(getpid());
  fs::remove_all(tmp);
  Status s = WriteSyntheticModel(preset, tmp, /*seed=*/1, dtype);
  EXPECT_TRUE(s.ok()) << s.ToString();
  std::error_code ec;
  fs::rename(tmp, dir, ec);  // fails harmlessly if another process got there first
  if (ec) fs::remove_all(tmp);
  return dir;
}

}  // namespace pdserve::testing
