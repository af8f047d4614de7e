#include "model/matrix.h"

#include <cstring>
#include <utility>

#include "kernels/kernels.h"

namespace pdserve {
namespace {

// Packed BF16 values of a matrix in the arena, rounded up to a whole cache line.
size_t ArenaElements(int64_t n, int64_t k) {
  constexpr size_t kLineElements = 64 / sizeof(uint16_t);
  const size_t elems = kernels::PackedBF16Elements(static_cast<int>(n), static_cast<int>(k));
  return (elems + kLineElements - 1) / kLineElements * kLineElements;
}

// Packs a BF16 matrix at *cursor in the arena (and advances it), or keeps an F32 one.
Matrix ToMatrix(Tensor w, uint16_t** cursor) {
  Matrix m;
  m.n = static_cast<int>(w.dim(0));
  m.k = static_cast<int>(w.dim(1));
  if (w.dtype() == DType::kF32) {
    m.f32 = std::move(w);
    return m;
  }
  m.bf16 = *cursor;
  kernels::PackBF16(w.as<uint16_t>(), m.n, m.k, *cursor);
  *cursor += ArenaElements(m.n, m.k);
  return m;  // the unpacked original is freed here
}

}  // namespace

size_t Matrix::bytes() const {
  return bf16 == nullptr ? f32.nbytes() : kernels::PackedBF16Elements(n, k) * sizeof(uint16_t);
}

Tensor TakeRows(const std::vector<RowSlice>& parts) {
  const RowSlice& first = parts.front();
  if (parts.size() == 1 && !first.keep && first.rows.begin == 0 &&
      first.rows.end == first.tensor->dim(0)) {
    return std::exchange(*first.tensor, Tensor());
  }
  std::vector<int64_t> shape = first.tensor->shape();
  shape[0] = 0;
  for (const RowSlice& p : parts) shape[0] += p.rows.size();
  Tensor out(first.tensor->dtype(), shape);
  auto* dst = static_cast<uint8_t*>(out.data());
  for (const RowSlice& p : parts) {
    const size_t row_bytes = p.tensor->nbytes() / static_cast<size_t>(p.tensor->dim(0));
    std::memcpy(dst, static_cast<const uint8_t*>(p.tensor->data()) + p.rows.begin * row_bytes,
                p.rows.size() * row_bytes);
    dst += p.rows.size() * row_bytes;
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
  size_t elements = 0;
  for (const Pending& p : pending_) {
    const Tensor& first = *p.parts.front().tensor;
    if (first.dtype() == DType::kF32) continue;
    int64_t rows = 0;
    for (const RowSlice& s : p.parts) rows += s.rows.size();
    elements += ArenaElements(rows, first.dim(1));
  }
  Tensor arena;
  constexpr size_t kPageElements = (size_t{2} << 20) / sizeof(uint16_t);
  if (elements > 0) {
    elements = (elements + kPageElements - 1) / kPageElements * kPageElements;
    arena = Tensor::Uninitialized(DType::kBF16, {static_cast<int64_t>(elements)});
  }
  uint16_t* cursor = arena.empty() ? nullptr : arena.as<uint16_t>();
  for (const Pending& p : pending_) *p.out = ToMatrix(TakeRows(p.parts), &cursor);
  pending_.clear();
  return arena;
}

}  // namespace pdserve
