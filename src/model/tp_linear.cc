#include "model/tp_linear.h"

#include <algorithm>
#include <cstring>

#include "common/check.h"
#include "kernels/kernels.h"

namespace pdserve {

void TpLinear::Linear(const float* x, int m, const Matrix& w, float* y) {
  if (w.fp8 != nullptr) {  // x stays F32: the FP8 values are widened inside the kernel
    kernels::MatMulFP8(x, w.fp8, y, m, w.n, w.k);
    return;
  }
  if (w.int8 != nullptr) {  // the same for INT8
    kernels::MatMulInt8(x, w.int8, y, m, w.n, w.k);
    return;
  }
  if (w.bf16 == nullptr) {
    kernels::MatMulF32(x, w.f32.as<float>(), y, m, w.n, w.k);
    return;
  }
  const size_t count = static_cast<size_t>(m) * w.k;
  if (x_bf16_.size() < count) x_bf16_.resize(count);
  kernels::ToBF16(x, x_bf16_.data(), count);
  kernels::MatMulBF16(x_bf16_.data(), w.bf16, y, m, w.n, w.k);
}

Status TpLinear::ColumnParallelLinear(const float* x, int m, const Matrix& w, DimRange cols,
                                      int width, float* y) {
  LinearIntoColumns(x, m, w, cols, width, y);
  return GatherColumns(y, m, width, cols);
}

void TpLinear::LinearIntoColumns(const float* x, int m, const Matrix& w, DimRange cols, int width,
                                 float* y) {
  if (cols.size() == width) {
    Linear(x, m, w, y);
    return;
  }
  if (cols.size() == 0) return;  // a rank may hold no column (more ranks than columns)
  slice_.resize(static_cast<size_t>(m) * cols.size());
  Linear(x, m, w, slice_.data());
  for (int r = 0; r < m; ++r) {
    std::memcpy(y + static_cast<size_t>(r) * width + cols.begin,
                &slice_[static_cast<size_t>(r) * cols.size()], cols.size() * sizeof(float));
  }
}

namespace {

// How a matrix is stored, as the products take it.
enum class Stored { kFp8, kInt8, kBF16, kF32 };
Stored StoredOf(const Matrix& w) {
  return w.fp8 != nullptr    ? Stored::kFp8
         : w.int8 != nullptr ? Stored::kInt8
         : w.bf16 != nullptr ? Stored::kBF16
                             : Stored::kF32;
}
const void* WeightsOf(const Matrix& w) {
  switch (StoredOf(w)) {
    case Stored::kFp8:
      return w.fp8;
    case Stored::kInt8:
      return w.int8;
    case Stored::kBF16:
      return w.bf16;
    case Stored::kF32:
      break;
  }
  return w.f32.as<float>();
}

}  // namespace

void TpLinear::GroupedLinear(const float* x, std::span<const RowGroup> groups, float* y) {
  if (groups.empty()) return;
  const int n = groups.front().w->n, k = groups.front().w->k;
  int rows = 0;  // x's rows up to the last group's
  for (const RowGroup& g : groups) {
    PD_CHECK(g.w->n == n && g.w->k == k);
    rows = std::max(rows, g.begin + g.rows);
  }
  // One grouped product per kind of storage among the matrices (usually one kind).
  for (const Stored kind : {Stored::kFp8, Stored::kInt8, Stored::kBF16, Stored::kF32}) {
    // BF16: every row rounded once (as Linear rounds the rows it is given); 8-bit and F32
    // products take x as it is.
    const bool bf16 = kind == Stored::kBF16;
    const size_t input_row = static_cast<size_t>(k) * (bf16 ? sizeof(uint16_t) : sizeof(float));
    products_.clear();
    for (const RowGroup& g : groups) {
      if (StoredOf(*g.w) != kind) continue;
      if (bf16 && products_.empty()) {
        const size_t count = static_cast<size_t>(rows) * k;
        if (x_bf16_.size() < count) x_bf16_.resize(count);
        kernels::ToBF16(x, x_bf16_.data(), count);
      }
      const auto* input = bf16 ? reinterpret_cast<const uint8_t*>(x_bf16_.data())
                               : reinterpret_cast<const uint8_t*>(x);
      products_.push_back({input + g.begin * input_row, WeightsOf(*g.w),
                           y + static_cast<size_t>(g.begin) * n, g.rows});
    }
    if (products_.empty()) continue;
    switch (kind) {
      case Stored::kFp8:
        kernels::MatMulFP8Grouped(products_, n, k);
        break;
      case Stored::kInt8:
        kernels::MatMulInt8Grouped(products_, n, k);
        break;
      case Stored::kBF16:
        kernels::MatMulBF16Grouped(products_, n, k);
        break;
      case Stored::kF32:
        kernels::MatMulF32Grouped(products_, n, k);
        break;
    }
  }
}

void TpLinear::GroupedLinearIntoColumns(const float* x, std::span<const RowGroup> groups,
                                        DimRange cols, int width, float* y) {
  if (cols.size() == width) {
    GroupedLinear(x, groups, y);
    return;
  }
  if (cols.size() == 0) return;  // a rank may hold no column (more ranks than columns)
  int rows = 0;
  for (const RowGroup& g : groups) rows = std::max(rows, g.begin + g.rows);
  slice_.resize(static_cast<size_t>(rows) * cols.size());
  GroupedLinear(x, groups, slice_.data());
  for (const RowGroup& g : groups) {
    for (int r = g.begin; r < g.begin + g.rows; ++r) {
      std::memcpy(y + static_cast<size_t>(r) * width + cols.begin,
                  &slice_[static_cast<size_t>(r) * cols.size()], cols.size() * sizeof(float));
    }
  }
}

Status TpLinear::GatherColumns(float* data, int rows, int width, DimRange cols) {
  if (tp_size_ == 1) return Status::Ok();
  return group_->AllGatherColumns(data, rows, width, cols.begin, cols.end);
}

}  // namespace pdserve
