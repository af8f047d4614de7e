// A router started in this process for the router tests: the options given, on a free port.
// Test-only; call from the test's thread (a failure is recorded as a test failure).
#pragma once

#include <memory>
#include <utility>

#include <gtest/gtest.h>

#include "router/router.h"

namespace pdserve::router {

// The started router, or null (the test already failed) when it cannot start.
inline std::unique_ptr<Router> StartRouter(RouterOptions options) {
  options.port = 0;
  auto router = Router::Create(std::move(options));
  EXPECT_TRUE(router.ok()) << router.status().ToString();
  if (!router.ok()) return nullptr;
  EXPECT_TRUE((*router)->Start().ok());
  return std::move(*router);
}

}  // namespace pdserve::router
