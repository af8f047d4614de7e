// Grouped products (an MoE layer's experts in one pass): each product of the group gives, bit
// for bit, what it gives alone, for BF16, FP8, INT8 and F32 weights on every kernel path, with
// groups of one row, of none, and of more rows than a token block.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "kernels/dispatch.h"
#include "kernels/kernels.h"
#include "testing/kernel_paths.h"

namespace pdserve {
namespace {

using ::pdserve::testing::KernelPathNames;
using ::pdserve::testing::KernelPathTestName;
using ::pdserve::testing::UseKernelPath;

constexpr int kN = 130;  // two 64-column blocks and a partial one
constexpr int kK = 200;  // a partial FP8 k block
// Rows of each product: one, none, a few, and more than a token block (96).
const std::vector<int> kRows = {1, 0, 7, 3, 101};

class GroupedMatMulTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { UseKernelPath(GetParam()); }
  void TearDown() override { (void)kernels::SelectPath("auto"); }
};

// Runs `alone(x, w, y, m)` per product and `grouped(products)` over all of them, on the inputs
// and weights `make_x(rows)` and `weights[i]` give, and compares every output bit for bit.
template <typename X, typename Alone, typename Grouped>
void ExpectGroupedEqualsAlone(const std::vector<std::vector<X>>& xs,
                              const std::vector<const void*>& weights, Alone alone,
                              Grouped grouped) {
  std::vector<std::vector<float>> want(xs.size()), got(xs.size());
  std::vector<kernels::GroupedProduct> products;
  for (size_t i = 0; i < xs.size(); ++i) {
    const int m = kRows[i];
    want[i].assign(static_cast<size_t>(m) * kN, 0.0f);
    got[i].assign(static_cast<size_t>(m) * kN, -1.0f);
    if (m > 0) alone(xs[i].data(), weights[i], want[i].data(), m);
    products.push_back({xs[i].data(), weights[i], got[i].data(), m});
  }
  grouped(products);
  for (size_t i = 0; i < xs.size(); ++i) {
    ASSERT_EQ(std::memcmp(want[i].data(), got[i].data(), want[i].size() * sizeof(float)), 0)
        << "product " << i << " (" << kRows[i] << " rows)";
  }
}

TEST_P(GroupedMatMulTest, EachProductEqualsItselfAlone) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<std::vector<float>> xs_f32;
  std::vector<std::vector<uint16_t>> xs_bf16;
  for (int m : kRows) {
    std::vector<float> x(static_cast<size_t>(m) * kK);
    for (float& v : x) v = value(rng);
    std::vector<uint16_t> xb(x.size());
    for (size_t i = 0; i < x.size(); ++i) xb[i] = F32ToBF16(x[i]);
    xs_f32.push_back(std::move(x));
    xs_bf16.push_back(std::move(xb));
  }
  // Each product its own weights, in each dtype.
  std::vector<std::vector<float>> w_f32;
  std::vector<std::vector<uint16_t>> w_bf16;
  std::vector<std::vector<uint8_t>> w_fp8, w_int8;
  std::uniform_int_distribution<int> byte(0, 255);
  for (size_t i = 0; i < kRows.size(); ++i) {
    std::vector<float> w(static_cast<size_t>(kN) * kK);
    for (float& v : w) v = value(rng);
    std::vector<uint16_t> wb(w.size());
    for (size_t j = 0; j < w.size(); ++j) wb[j] = F32ToBF16(w[j]);
    std::vector<uint16_t> packed(kernels::PackedBF16Elements(kN, kK));
    kernels::PackBF16(wb.data(), kN, kK, packed.data());
    std::vector<uint8_t> bytes(w.size());
    for (uint8_t& b : bytes) {
      do {
        b = static_cast<uint8_t>(byte(rng));
      } while ((b & 0x7f) == 0x7f);  // no NaN bytes
    }
    const int k_blocks = (kK + kernels::kFp8BlockK - 1) / kernels::kFp8BlockK;
    std::vector<float> scales(static_cast<size_t>(kN) * k_blocks);
    for (float& s : scales) s = 0.001f * (1.0f + value(rng) * value(rng));
    std::vector<uint8_t> fp8(kernels::PackedFP8Bytes(kN, kK));
    kernels::PackFP8(bytes.data(), scales.data(), kN, kK, fp8.data());
    std::vector<uint8_t> int8(kernels::PackedInt8Bytes(kN, kK));
    kernels::PackInt8(reinterpret_cast<const int8_t*>(bytes.data()), scales.data(), kN, kK,
                      int8.data());
    w_int8.push_back(std::move(int8));
    w_f32.push_back(std::move(w));
    w_bf16.push_back(std::move(packed));
    w_fp8.push_back(std::move(fp8));
  }
  std::vector<const void*> f32, bf16, fp8, int8;
  for (size_t i = 0; i < kRows.size(); ++i) {
    int8.push_back(w_int8[i].data());
    f32.push_back(w_f32[i].data());
    bf16.push_back(w_bf16[i].data());
    fp8.push_back(w_fp8[i].data());
  }
  ExpectGroupedEqualsAlone(
      xs_bf16, bf16,
      [](const uint16_t* x, const void* w, float* y, int m) {
        kernels::MatMulBF16(x, static_cast<const uint16_t*>(w), y, m, kN, kK);
      },
      [](const auto& p) { kernels::MatMulBF16Grouped(p, kN, kK); });
  ExpectGroupedEqualsAlone(
      xs_f32, fp8,
      [](const float* x, const void* w, float* y, int m) {
        kernels::MatMulFP8(x, static_cast<const uint8_t*>(w), y, m, kN, kK);
      },
      [](const auto& p) { kernels::MatMulFP8Grouped(p, kN, kK); });
  ExpectGroupedEqualsAlone(
      xs_f32, int8,
      [](const float* x, const void* w, float* y, int m) {
        kernels::MatMulInt8(x, static_cast<const uint8_t*>(w), y, m, kN, kK);
      },
      [](const auto& p) { kernels::MatMulInt8Grouped(p, kN, kK); });
  ExpectGroupedEqualsAlone(
      xs_f32, f32,
      [](const float* x, const void* w, float* y, int m) {
        kernels::MatMulF32(x, static_cast<const float*>(w), y, m, kN, kK);
      },
      [](const auto& p) { kernels::MatMulF32Grouped(p, kN, kK); });
}

INSTANTIATE_TEST_SUITE_P(Paths, GroupedMatMulTest, ::testing::ValuesIn(KernelPathNames()),
                         [](const auto& info) { return KernelPathTestName(info.param); });

}  // namespace
}  // namespace pdserve
