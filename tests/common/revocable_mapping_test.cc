// RevocableMapping: a view shares the file's bytes until revoked; afterwards writes through it
// reach throwaway memory and never the file, while the address stays writable.
#include "common/revocable_mapping.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include <gtest/gtest.h>

namespace pdserve {
namespace {

class RevocableMappingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fd_ = memfd_create("revocable-mapping-test", MFD_CLOEXEC);
    ASSERT_GE(fd_, 0);
    ASSERT_EQ(ftruncate(fd_, kBytes), 0);
  }
  void TearDown() override { close(fd_); }
  static constexpr size_t kBytes = 1 << 20;
  int fd_ = -1;
};

TEST_F(RevocableMappingTest, AViewSharesTheFileUntilRevoked) {
  auto file = RevocableMapping::Map(fd_, kBytes);
  auto view = RevocableMapping::Map(fd_, kBytes);
  ASSERT_TRUE(file.ok() && view.ok());
  ASSERT_NE(file->data(), view->data());
  std::memset(view->data(), 0x11, kBytes);
  EXPECT_EQ(file->data()[kBytes - 1], std::byte{0x11});

  std::byte* const address = view->data();
  ASSERT_TRUE(view->Revoke().ok());
  EXPECT_TRUE(view->revoked());
  EXPECT_EQ(view->data(), address);  // the address stays, and stays writable
  EXPECT_EQ(view->data()[0], std::byte{0});
  std::memset(view->data(), 0x22, kBytes);
  for (size_t i = 0; i < kBytes; i += 4096) {
    ASSERT_EQ(file->data()[i], std::byte{0x11})
        << "a write through a revoked view reached byte " << i;
  }
  std::memset(file->data(), 0x33, kBytes);
  EXPECT_EQ(view->data()[0], std::byte{0x22});  // nor does the file show through it any more
  EXPECT_TRUE(view->Revoke().ok());             // idempotent
}

TEST_F(RevocableMappingTest, MovesKeepOneOwnerAndBadArgumentsAreErrors) {
  auto view = RevocableMapping::Map(fd_, kBytes);
  ASSERT_TRUE(view.ok());
  std::byte* const address = view->data();
  RevocableMapping moved = std::move(*view);
  EXPECT_EQ(moved.data(), address);
  EXPECT_EQ(view->data(), nullptr);
  EXPECT_TRUE(view->Revoke().ok());  // an empty object has nothing to revoke
  RevocableMapping assigned;
  assigned = std::move(moved);
  EXPECT_EQ(assigned.data(), address);
  EXPECT_EQ(assigned.size(), kBytes);
  EXPECT_EQ(RevocableMapping::Map(fd_, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(RevocableMapping::Map(-1, kBytes).ok());
}

}  // namespace
}  // namespace pdserve
