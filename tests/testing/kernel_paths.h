// Runs tests on every kernel path compiled in (kernels/dispatch.h). Header-only: for test
// binaries that link pdserve_kernels (directly or through the model). Main thread only.
#pragma once

#include <cctype>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/dispatch.h"

namespace pdserve::testing {

// Every path this build has, best first, whether or not this CPU can run it: a path the CPU
// lacks shows up as a SKIPPED test rather than vanishing from the list.
inline std::vector<std::string> KernelPathNames() {
  std::vector<std::string> names;
  for (std::string_view name : kernels::KnownPaths()) names.emplace_back(name);
  return names;
}

// `path` as a test name part: GoogleTest allows only letters, digits and '_' ("amx-model" ->
// "amx_model").
inline std::string KernelPathTestName(std::string path) {
  for (char& c : path) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return path;
}

// Selects `path`, or marks the current test SKIPPED, loudly, when this CPU cannot run it. Call
// from SetUp (or the test body, returning if IsSkipped()).
inline void UseKernelPath(const std::string& path) {
  if (Status s = kernels::SelectPath(path); !s.ok()) {
    GTEST_SKIP() << "KERNEL PATH NOT TESTED ON THIS CPU: " << s.ToString();
  }
}

}  // namespace pdserve::testing
