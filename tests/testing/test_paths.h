// Paths of the shared test data (../shared/models, ../shared/tokenizers) and of built
// binaries, for tests only. A test whose data is missing calls PD_REQUIRE_SHARED, which
// prints a loud notice and marks the test SKIPPED (ctest reports it as skipped, never passed).
#pragma once

#include <string>

#include <gtest/gtest.h>

namespace pdserve::testing {

// Absolute path of `relative` under the shared folder (e.g. "models/stories260K").
std::string SharedPath(const std::string& relative);
// True if the path exists; otherwise prints a loud "MISSING TEST DATA" banner to stderr.
bool SharedPathExists(const std::string& relative);
// Absolute path of a file in the build tree (e.g. "src/cli/pdserve").
std::string BinaryPath(const std::string& relative);
// A fresh, empty temporary directory (removed by the caller or left in /tmp).
std::string MakeTempDir(const std::string& prefix);
// The whole of the file at `path`, byte for byte ("" if it cannot be read).
std::string ReadFile(const std::string& path);

}  // namespace pdserve::testing

#define PD_REQUIRE_SHARED(relative)                                                      \
  do {                                                                                   \
    if (!::pdserve::testing::SharedPathExists(relative)) {                               \
      GTEST_SKIP() << "MISSING TEST DATA: " << ::pdserve::testing::SharedPath(relative); \
    }                                                                                    \
  } while (0)
