// Test helpers shared by the config, safetensors, weights and synthetic-model tests.
// Test-only; thread-compatible.
#pragma once

#include <filesystem>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "testing/test_paths.h"

namespace pdserve::testing {

// Passes when `text` contains `part`; prints the whole text otherwise.
inline ::testing::AssertionResult Mentions(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not mention '" << part << "'";
}

// A fresh temporary directory, removed with everything in it when this goes out of scope.
class ScopedTempDir {
 public:
  explicit ScopedTempDir(const std::string& prefix) : path_(MakeTempDir(prefix)) {}
  ~ScopedTempDir() { Remove(); }
  ScopedTempDir(ScopedTempDir&& other) noexcept : path_(std::exchange(other.path_, {})) {}
  ScopedTempDir& operator=(ScopedTempDir&& other) noexcept {
    if (this != &other) {
      Remove();
      path_ = std::exchange(other.path_, {});
    }
    return *this;
  }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  void Remove() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  std::string path_;
};

}  // namespace pdserve::testing
