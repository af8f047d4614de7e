#include "model/tp_linear.h"

#include <cstring>

#include "kernels/kernels.h"

namespace pdserve {

void TpLinear::Linear(const float* x, int m, const Matrix& w, float* y) {
  if (w.fp8 != nullptr) {  // x stays F32: the FP8 values are widened inside the kernel
    kernels::MatMulFP8(x, w.fp8, y, m, w.n, w.k);
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

Status TpLinear::GatherColumns(float* data, int rows, int width, DimRange cols) {
  if (tp_size_ == 1) return Status::Ok();
  return group_->AllGatherColumns(data, rows, width, cols.begin, cols.end);
}

}  // namespace pdserve
