// Checks shared by the kernels tests of every weight format: a product's rows do not depend on
// the batch they are computed in, nor on the OpenMP team's size. `matmul` is a kernels::MatMul*
// function (x, packed w, y, m, n, k).
#pragma once

#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <vector>

namespace pdserve::testing {

// Every row of a product over rows [first, first + count) equals that row computed alone, bit
// for bit, for windows of a batch of x.size() / k rows (tile tails of every size are exercised);
// with `all_at_once` > 0, also the first all_at_once rows in one product.
template <typename X, typename W, typename MatMul>
void ExpectRowsIndependentOfBatch(const std::vector<X>& x, const W* w, int n, int k, MatMul matmul,
                                  int all_at_once = 0) {
  const int rows = static_cast<int>(x.size() / k);
  std::vector<float> alone(static_cast<size_t>(rows) * n);
  for (int i = 0; i < rows; ++i) {
    matmul(&x[static_cast<size_t>(i) * k], w, &alone[static_cast<size_t>(i) * n], 1, n, k);
  }
  std::vector<float> y(static_cast<size_t>(rows) * n);
  if (all_at_once > 0) {
    matmul(x.data(), w, y.data(), all_at_once, n, k);
    ASSERT_EQ(std::memcmp(y.data(), alone.data(), sizeof(float) * all_at_once * n), 0)
        << "m = " << all_at_once;
  }
  for (int first = 0; first < rows; first += 3) {
    for (int count = 1; first + count <= rows; count += 5) {
      matmul(&x[static_cast<size_t>(first) * k], w, y.data(), count, n, k);
      ASSERT_EQ(
          std::memcmp(y.data(), &alone[static_cast<size_t>(first) * n], sizeof(float) * count * n),
          0)
          << "rows [" << first << ", " << first + count << ")";
    }
  }
}

// The same bits with 1, 2, 3 and 5 OpenMP threads, for 1 and for all x.size() / k rows.
template <typename X, typename W, typename MatMul>
void ExpectSameBitsForEveryThreadCount(const std::vector<X>& x, const W* w, int n, int k,
                                       MatMul matmul) {
  const int m = static_cast<int>(x.size() / k);
  std::vector<float> want(static_cast<size_t>(m) * n), got(want.size());
  omp_set_num_threads(1);
  matmul(x.data(), w, want.data(), m, n, k);
  for (const int threads : {2, 3, 5}) {
    omp_set_num_threads(threads);
    for (const int rows : {1, m}) {
      matmul(x.data(), w, got.data(), rows, n, k);
      ASSERT_EQ(std::memcmp(got.data(), want.data(), sizeof(float) * rows * n), 0)
          << threads << " threads, " << rows << " rows";
    }
  }
}

}  // namespace pdserve::testing
