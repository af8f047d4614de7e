// TpLinear: the matrix products of one tensor-parallel rank and the gathers that join the ranks'
// column slices (model/tp_group.h). A rank computes its columns of a product and gathers the
// others', so every output element is reduced in the one-rank order (DESIGN.md §6). Keeps the
// scratch the products need between calls. Not thread-safe: the forward thread owns it (the
// kernels use OpenMP inside).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "kernels/kernels.h"
#include "model/matrix.h"
#include "model/tp_group.h"
#include "model/tp_slices.h"

namespace pdserve {

class TpLinear {
 public:
  explicit TpLinear(int tp_size) : tp_size_(tp_size) {}
  TpLinear(const TpLinear&) = delete;
  TpLinear& operator=(const TpLinear&) = delete;

  // The group this rank gathers with; required before a product when tp_size > 1. Not owned.
  void set_group(TpGroup* group) { group_ = group; }
  TpGroup* group() const { return group_; }

  // y[m][n] = x[m][k] * w^T, in the weight's dtype (BF16: x rounded to BF16; FP8: x as is).
  void Linear(const float* x, int m, const Matrix& w, float* y);
  // y[m][width] = x * W^T where this rank holds W's rows `cols` (as w): computes its columns
  // and gathers the others' (with one rank, a plain Linear into y).
  Status ColumnParallelLinear(const float* x, int m, const Matrix& w, DimRange cols, int width,
                              float* y);
  // The first half of ColumnParallelLinear: this rank's columns `cols` of y[m][width] (the
  // others are left as they are, for one GatherColumns over several products).
  void LinearIntoColumns(const float* x, int m, const Matrix& w, DimRange cols, int width,
                         float* y);
  // Products of one shape at once (an MoE layer's experts): for each group, rows [begin, begin
  // + rows) of x ([*][k]) times its w into the same rows of y ([*][w.n]); every w of one shape
  // (of any storage: one pass per kind). Each row gets exactly what Linear gives it, in one
  // parallel pass for all groups of a kind.
  struct RowGroup {
    int begin = 0;
    int rows = 0;
    const Matrix* w = nullptr;
  };
  void GroupedLinear(const float* x, std::span<const RowGroup> groups, float* y);
  // GroupedLinear into this rank's columns `cols` of y[*][width], as LinearIntoColumns.
  void GroupedLinearIntoColumns(const float* x, std::span<const RowGroup> groups, DimRange cols,
                                int width, float* y);
  // data is [rows][width] of which this rank has computed columns `cols`: with more than one
  // rank, gathers the others' columns (TpGroup::AllGatherColumns); with one, nothing to do.
  Status GatherColumns(float* data, int rows, int width, DimRange cols);

 private:
  int tp_size_;
  TpGroup* group_ = nullptr;
  std::vector<float> slice_;      // this rank's columns of a product, before the gather
  std::vector<uint16_t> x_bf16_;  // the input of a BF16 product
  std::vector<kernels::GroupedProduct> products_;  // of a grouped product
};

}  // namespace pdserve
