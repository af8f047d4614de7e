#include "common/status.h"

#include <gtest/gtest.h>

namespace pdserve {
namespace {

Result<int> ParsePositive(int v) {
  if (v <= 0) return Status::InvalidArgument("not positive");
  return v;
}

Status Doubled(int v, int* out) {
  PD_ASSIGN_OR_RETURN(int x, ParsePositive(v));
  *out = 2 * x;
  return Status::Ok();
}

TEST(StatusTest, OkAndErrorCarryCodeAndMessage) {
  EXPECT_TRUE(Status::Ok().ok());
  Status s = Status::NotFound("tensor x");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.ToString(), "NOT_FOUND: tensor x");
  EXPECT_EQ(s.WithContext("model.safetensors").message(), "model.safetensors: tensor x");
  EXPECT_TRUE(Status::InProgress().in_progress());
  EXPECT_FALSE(Status::InProgress().ok());
}

TEST(StatusTest, ResultPropagatesThroughMacros) {
  int out = 0;
  EXPECT_TRUE(Doubled(21, &out).ok());
  EXPECT_EQ(out, 42);
  Status bad = Doubled(-1, &out);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
}

TEST(StatusTest, ResultFromOkStatusIsAnInternalError) {
  Result<int> r(Status::Ok());
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

TEST(StatusTest, FromErrnoNamesTheError) {
  Status s = Status::FromErrno("open(/x)", ENOENT);
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find("No such file"), std::string::npos);
}

}  // namespace
}  // namespace pdserve
