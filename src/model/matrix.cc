#include "model/matrix.h"

#include <cstring>
#include <utility>

#include "common/check.h"
#include "kernels/kernels.h"

namespace pdserve {
namespace {

// Bytes a packed BF16, FP8 or INT8 matrix takes in the arena, rounded up to a whole cache line; 0
// for an F32 one (kept apart).
size_t ArenaBytes(DType dtype, int64_t n, int64_t k) {
  size_t bytes = 0;
  if (dtype == DType::kBF16) {
    bytes =
        kernels::PackedBF16Elements(static_cast<int>(n), static_cast<int>(k)) * sizeof(uint16_t);
  } else if (dtype == DType::kF8E4M3) {
    bytes = kernels::PackedFP8Bytes(static_cast<int>(n), static_cast<int>(k));
  } else if (dtype == DType::kI8) {
    bytes = kernels::PackedInt8Bytes(static_cast<int>(n), static_cast<int>(k));
  }
  return (bytes + 63) / 64 * 64;
}

// Packs a BF16 or FP8 matrix at *cursor in the arena (and advances it), or keeps an F32 one.
Matrix ToMatrix(Tensor w, uint8_t** cursor) {
  Matrix m;
  m.n = static_cast<int>(w.dim(0));
  m.k = static_cast<int>(w.dim(1));
  if (w.dtype() == DType::kF32) {
    m.f32 = std::move(w);
    return m;
  }
  if (w.dtype() == DType::kF8E4M3) {
    m.fp8 = *cursor;
    kernels::PackFP8(w.as<uint8_t>(), w.row_scales().as<float>(), m.n, m.k, *cursor);
  } else if (w.dtype() == DType::kI8) {
    m.int8 = *cursor;
    kernels::PackInt8(w.as<int8_t>(), w.row_scales().as<float>(), m.n, m.k, *cursor);
  } else {
    PD_CHECK(w.dtype() == DType::kBF16);
    m.bf16 = reinterpret_cast<const uint16_t*>(*cursor);
    kernels::PackBF16(w.as<uint16_t>(), m.n, m.k, reinterpret_cast<uint16_t*>(*cursor));
  }
  *cursor += ArenaBytes(w.dtype(), m.n, m.k);
  return m;  // the unpacked original is freed here
}

// The rows of `parts` (all of one dtype) one after the other in `out`, [rows][row_bytes].
void CopyRows(const std::vector<RowSlice>& parts, const Tensor& (*of)(const Tensor&), Tensor* out) {
  auto* dst = static_cast<uint8_t*>(out->data());
  for (const RowSlice& p : parts) {
    const Tensor& t = of(*p.tensor);
    const size_t row_bytes = t.nbytes() / static_cast<size_t>(t.dim(0));
    std::memcpy(dst, static_cast<const uint8_t*>(t.data()) + p.rows.begin * row_bytes,
                p.rows.size() * row_bytes);
    dst += p.rows.size() * row_bytes;
  }
}

}  // namespace

namespace {

// Plain transposition of rows [row, row + n) of any dtype's [*][k] matrix, scales not included.
Tensor TransposeElements(const Tensor& w, int64_t row, int64_t n) {
  const int64_t k = w.dim(1);
  const size_t elem = DTypeSize(w.dtype());
  Tensor t = Tensor::Uninitialized(w.dtype(), {k, n});
  const auto* src = static_cast<const uint8_t*>(w.data());
  auto* dst = static_cast<uint8_t*>(t.data());
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < k; ++j) {
      std::memcpy(dst + (j * n + i) * elem, src + ((row + i) * k + j) * elem, elem);
    }
  }
  return t;
}

// The row scales of the transposed FP8 or INT8 rows [row, row + n) of w (TransposeRows), or an
// empty tensor when a 128-wide block of a transposed row would need more than one scale.
Tensor TransposedScales(const Tensor& w, int64_t row, int64_t n) {
  constexpr int kBlock = kernels::kFp8BlockK;
  const Tensor& scales = w.row_scales();
  const int64_t k = w.dim(1), k_blocks = scales.dim(1), t_blocks = (n + kBlock - 1) / kBlock;
  Tensor out = Tensor::Uninitialized(DType::kF32, {k, t_blocks});
  for (int64_t j = 0; j < k; ++j) {           // a row of the result: column j of w
    for (int64_t b = 0; b < t_blocks; ++b) {  // its 128-wide block b: rows row + 128b.. of w
      const float s = scales.as<float>()[(row + b * kBlock) * k_blocks + j / kBlock];
      for (int64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) {
        if (scales.as<float>()[(row + i) * k_blocks + j / kBlock] != s) return Tensor();
      }
      out.as<float>()[j * t_blocks + b] = s;
    }
  }
  return out;
}

}  // namespace

Tensor TransposeRows(const Tensor& w, int64_t row, int64_t n) {
  if (!IsBlockScaled(w.dtype())) return TransposeElements(w, row, n);
  Tensor scales = TransposedScales(w, row, n);
  if (scales.empty()) {
    const Tensor f32 = Dequantise8(w, DType::kF32);
    return TransposeElements(f32, row, n);
  }
  Tensor t = TransposeElements(w, row, n);
  t.set_row_scales(std::move(scales));
  return t;
}

size_t Matrix::bytes() const {
  if (fp8 != nullptr) return kernels::PackedFP8Bytes(n, k);
  if (int8 != nullptr) return kernels::PackedInt8Bytes(n, k);
  return bf16 == nullptr ? f32.nbytes() : kernels::PackedBF16Elements(n, k) * sizeof(uint16_t);
}

Tensor TakeRows(const std::vector<RowSlice>& parts) {
  const RowSlice& first = parts.front();
  if (parts.size() == 1 && !first.keep && first.rows.begin == 0 &&
      first.rows.end == first.tensor->dim(0)) {
    return std::exchange(*first.tensor, Tensor());
  }
  // 8-bit rows joined with rows of another dtype: dequantised to it, so one product reads them.
  DType dtype = first.tensor->dtype();
  for (const RowSlice& p : parts) {
    if (!IsBlockScaled(p.tensor->dtype())) dtype = p.tensor->dtype();
  }
  std::vector<Tensor> dequantised;
  dequantised.reserve(parts.size());
  std::vector<RowSlice> same = parts;
  for (RowSlice& p : same) {
    if (p.tensor->dtype() != dtype) {
      dequantised.push_back(Dequantise8(*p.tensor, dtype));
      p.tensor = &dequantised.back();
    }
  }
  std::vector<int64_t> shape = first.tensor->shape();
  shape[0] = 0;
  for (const RowSlice& p : same) shape[0] += p.rows.size();
  Tensor out(dtype, shape);
  CopyRows(
      same, [](const Tensor& t) -> const Tensor& { return t; }, &out);
  if (IsBlockScaled(dtype)) {  // each row takes its own scales
    Tensor scales(DType::kF32, {shape[0], first.tensor->row_scales().dim(1)});
    CopyRows(
        same, [](const Tensor& t) -> const Tensor& { return t.row_scales(); }, &scales);
    out.set_row_scales(std::move(scales));
  }
  for (const RowSlice& p : parts) {
    if (!p.keep) *p.tensor = Tensor();
  }
  return out;
}

void MatrixPacker::Add(std::vector<RowSlice> parts, Matrix* out) {
  pending_.push_back({std::move(parts), out});
}

Tensor MatrixPacker::Pack() {
  size_t bytes = 0;
  for (const Pending& p : pending_) {
    // The dtype TakeRows will give: 8-bit only when every part is.
    DType dtype = p.parts.front().tensor->dtype();
    for (const RowSlice& s : p.parts) {
      if (!IsBlockScaled(s.tensor->dtype())) dtype = s.tensor->dtype();
    }
    int64_t rows = 0;
    for (const RowSlice& s : p.parts) rows += s.rows.size();
    bytes += ArenaBytes(dtype, rows, p.parts.front().tensor->dim(1));
  }
  Tensor arena;
  constexpr size_t kPageBytes = size_t{2} << 20;
  if (bytes > 0) {
    bytes = (bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
    arena = Tensor::Uninitialized(DType::kBF16, {static_cast<int64_t>(bytes / sizeof(uint16_t))});
  }
  uint8_t* cursor = arena.empty() ? nullptr : arena.as<uint8_t>();
  for (const Pending& p : pending_) *p.out = ToMatrix(TakeRows(p.parts), &cursor);
  pending_.clear();
  return arena;
}

}  // namespace pdserve
