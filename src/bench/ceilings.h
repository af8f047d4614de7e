// Hardware ceilings for `pdserve bench engine`: the GEMM rate through oneDNN (what
// prefill, a large matrix product, can at best reach) and the streaming memory read bandwidth
// (what bounds decode, which reads every weight once per step: tokens/s <= bandwidth / weight
// bytes). Each call runs a short measurement on the calling thread plus an OpenMP team.
// Thread-compatible: don't run two at once or next to other compute (they would measure each
// other). MeasureGemmFlops sets the OpenMP thread count for oneDNN and restores it after.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "common/status.h"

namespace pdserve {

// FLOP/s (2*m*n*k per product) of a `type` x `type` -> f32 (type: DType::kBF16 or kF32) oneDNN
// matmul, src [m, k] row-major, weights [n, k] row-major as in a Hugging Face checkpoint and
// reordered once into the layout oneDNN prefers (format_tag::any), as the engine does. Repeats the
// product for about `seconds` (at least once after a warm-up) and reports the best run: a ceiling,
// not an average disturbed by neighbours. threads <= 0: OpenMP's default. InvalidArgument on bad
// sizes; Unavailable if oneDNN has no such matmul here (oneDNN runs bf16 matmuls only on CPUs with
// AVX-512 or AVX2-VNNI-2; an AVX2 host has f32 only).
Result<double> MeasureGemmFlops(DType type, int m, int n, int k, int threads, double seconds);

// Bytes read per second streaming through a buffer of `bytes` (choose it well above the
// last-level cache, e.g. 1 GiB) with `threads` OpenMP threads (<= 0: OpenMP's default), each
// reading its own contiguous slice with 64-byte vector loads, passes taking kProbePasses reads
// in turn: plain, and every line prefetched 2 KB or 4 KB ahead (whichever the machine streams
// fastest counts).
// Best full pass within about `seconds` (at least one after a warm-up). InvalidArgument on bad
// sizes, ResourceExhausted if the buffer cannot be mapped.
Result<double> MeasureMemoryBandwidth(size_t bytes, int threads, double seconds);

// The kinds of pass MemoryBandwidthProbe takes in turn.
inline constexpr int kProbePasses = 3;

// The XOR of every 64-bit word of [p, p + bytes) as pass `pass` (0 .. kProbePasses - 1) of the
// probe reads it (the widest loads the CPU runs). p is 64-byte aligned, bytes a multiple of 64.
// For tests: every byte must be read.
uint64_t XorAsProbeReads(const uint8_t* p, size_t bytes, int pass);

// The same measurement with the buffer kept between calls, for a benchmark that measures the
// ceiling once per round: mapping, faulting in and unmapping 1 GiB every round leaves the
// kernel busy for a while afterwards, and that slowed the figure measured next
// (docs/benchmarks.md, "Method").
class MemoryBandwidthProbe {
 public:
  static Result<MemoryBandwidthProbe> Create(size_t bytes, int threads);
  MemoryBandwidthProbe(MemoryBandwidthProbe&&) noexcept;
  MemoryBandwidthProbe& operator=(MemoryBandwidthProbe&&) noexcept;
  ~MemoryBandwidthProbe();
  // The best pass within about `seconds` (at least one after a warm-up pass), bytes per second.
  Result<double> Measure(double seconds);
  // One timed pass over the whole buffer, the next kind of read in turn: bytes per second. For
  // a benchmark that interleaves passes with the work the ceiling bounds, so that both see the
  // same neighbours (the caller takes the best).
  double Pass();

 private:
  MemoryBandwidthProbe(uint8_t* data, size_t bytes, int threads);
  uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
  int threads_ = 0;
  int next_kind_ = 0;  // the read the next pass takes (XorAsProbeReads' pass)
  uint64_t sink_ = 0;  // the XOR of everything read, so that the loads cannot be optimised away
};

}  // namespace pdserve
