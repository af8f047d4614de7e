// Matrix: a weight matrix in the form the kernels take; MatrixPacker: puts a model's BF16 and
// FP8 matrices back to back into one arena, in the order a forward pass reads them.
// Matrix is read-only after packing (safe from any thread); MatrixPacker is used once, by the
// thread that builds the model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/tp_slices.h"
#include "model/weights.h"

namespace pdserve {

// A weight matrix [n][k]: BF16 packed by kernels::PackBF16, FP8 or INT8 with its scales packed
// by kernels::PackFP8 or PackInt8 (inside a MatrixPacker's arena), or F32 row-major.
struct Matrix {
  const uint16_t* bf16 = nullptr;
  const uint8_t* fp8 = nullptr;
  const uint8_t* int8 = nullptr;
  Tensor f32;
  int n = 0;
  int k = 0;
  size_t bytes() const;  // bytes a product reads
};

// Rows [rows.begin, rows.end) of a tensor (its first dimension), to be joined with others.
struct RowSlice {
  Tensor* tensor;
  DimRange rows;
  bool keep = false;  // the tensor lives on after (a tied embedding sliced for a TP rank)
};

// The given rows of tensors of equal column count, concatenated; the tensors are released
// unless kept. A single whole tensor is moved, not copied. FP8 and INT8 rows keep their row
// scales; such parts joined with parts of another dtype are dequantised to it (Dequantise8).
Tensor TakeRows(const std::vector<RowSlice>& parts);

// Rows [row, row + n) of a matrix tensor [*][k], transposed: [k][n], in the same dtype. An FP8
// matrix stays FP8 when each row of the result keeps one scale per 128-wide block (the rows
// taken start on a multiple of 128 and their scales change only every 128 rows, as DeepSeek's
// 128 x 128 blocks do, e.g. kv_b_proj's heads of 128 rows); otherwise it is dequantised to F32
// (exactly as DequantiseFp8 weighs it).
Tensor TransposeRows(const Tensor& w, int64_t row, int64_t n);

// Every packed BF16 matrix of a model, back to back in the order they were added, in one
// allocation of whole 2 MB pages. With separate allocations the small matrices (q|k|v,
// o_proj) read several times slower after the large ones streamed past, most likely from 4 KB
// pages (a TLB miss each, a nested page walk in a VM; measured: docs/kernels.md, "BF16
// products"). Add every matrix first, then Pack once: the arena is sized before any matrix is
// packed into it.
class MatrixPacker {
 public:
  // *out will hold the rows `parts` joined (this rank's share of the tensors). `out` and the
  // tensors must stay where they are until Pack.
  void Add(std::vector<RowSlice> parts, Matrix* out);
  // Packs every added matrix (F32 ones are kept as they are) and returns the arena that holds
  // them, empty when none is BF16 or FP8. The arena's pages are touched only as each matrix is
  // packed into it, while the unpacked originals are freed one by one, so loading still holds about
  // one copy of the weights.
  Tensor Pack();

 private:
  struct Pending {
    std::vector<RowSlice> parts;
    Matrix* out;
  };
  std::vector<Pending> pending_;
};

}  // namespace pdserve
