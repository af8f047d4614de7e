#include "bench/ceilings.h"

#include <omp.h>
#include <sys/mman.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <new>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <oneapi/dnnl/dnnl.hpp>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <string_view>

#include "common/check.h"
#include "common/dtype.h"
#include "kernels/dispatch.h"

namespace pdserve {
namespace {

constexpr size_t kLineBytes = 64;

using Clock = std::chrono::steady_clock;

// Runs `once` after one warm-up call, again and again until `seconds` have passed (at least
// once), and returns the shortest run in seconds.
template <typename Fn>
double BestRunSeconds(double seconds, Fn&& once) {
  once();  // warm-up: page faults, oneDNN's JIT, caches
  const Clock::time_point start = Clock::now();
  double best = INFINITY;
  do {
    const Clock::time_point t0 = Clock::now();
    once();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  } while (std::chrono::duration<double>(Clock::now() - start).count() < seconds);
  return best;
}

Status CheckDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0.0) {
    return Status::InvalidArgument(fmt::format("seconds must be >= 0, got {}", seconds));
  }
  return Status::Ok();
}

// Sets OpenMP's thread count for the scope (oneDNN's OMP runtime reads it) and restores it.
class ScopedOmpThreads {
 public:
  explicit ScopedOmpThreads(int threads) : saved_(omp_get_max_threads()) {
    if (threads > 0) omp_set_num_threads(threads);
  }
  ~ScopedOmpThreads() { omp_set_num_threads(saved_); }
  ScopedOmpThreads(const ScopedOmpThreads&) = delete;
  ScopedOmpThreads& operator=(const ScopedOmpThreads&) = delete;

 private:
  int saved_;
};

// XOR of every 64-bit word in [p, p + bytes); bytes is a multiple of kLineBytes and p is
// page-aligned. Four independent vector accumulators keep several loads in flight. kAhead > 0:
// every line is also prefetched kAhead bytes ahead (the hardware prefetchers stop at each 4 KB
// page). Which read streams fastest depends on the machine, so the probe times each (see
// Measure); the engine's one-row decode tiles prefetch every line, so the probe must too.
//
// The binary targets baseline x86-64, so the reads are compiled for the widest vectors the CPU
// has (chosen at run time, as the kernels' paths are): compiled for the baseline only, the
// probe read with 16-byte loads and no prefetch and under-read the engine's own decode.
// Measured (both): docs/benchmarks.md, "Method", the read probe.
constexpr size_t kPassAhead[kProbePasses] = {0, 2048, 4096};

uint64_t XorWords(const uint64_t* words, size_t n) {
  uint64_t x = 0;
  for (size_t i = 0; i < n; ++i) x ^= words[i];
  return x;
}

#if defined(__x86_64__)
template <size_t kAhead>
[[gnu::target("avx512f")]] uint64_t XorLinesAvx512(const uint8_t* p, size_t bytes) {
  __m512i acc[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                    _mm512_setzero_si512()};
  for (size_t i = 0; i < bytes; i += 4 * kLineBytes) {
    if constexpr (kAhead > 0) {
      // Past the end of the slice this only touches the next slice or is dropped.
      for (size_t j = 0; j < 4; ++j) {
        _mm_prefetch(reinterpret_cast<const char*>(p + i + kAhead + j * kLineBytes), _MM_HINT_T0);
      }
    }
    const size_t lines = std::min<size_t>(4, (bytes - i) / kLineBytes);
    for (size_t j = 0; j < lines; ++j) {
      acc[j] = _mm512_xor_si512(acc[j], _mm512_load_si512(p + i + j * kLineBytes));
    }
  }
  alignas(64) uint64_t lanes[4 * 8];
  for (int j = 0; j < 4; ++j) _mm512_store_si512(lanes + 8 * j, acc[j]);
  return XorWords(lanes, 4 * 8);
}

template <size_t kAhead>
[[gnu::target("avx2")]] uint64_t XorLinesAvx2(const uint8_t* p, size_t bytes) {
  __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                    _mm256_setzero_si256()};
  for (size_t i = 0; i < bytes; i += 2 * kLineBytes) {
    if constexpr (kAhead > 0) {
      _mm_prefetch(reinterpret_cast<const char*>(p + i + kAhead), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(p + i + kAhead + kLineBytes), _MM_HINT_T0);
    }
    const size_t halves = std::min<size_t>(4, (bytes - i) / 32);
    for (size_t j = 0; j < halves; ++j) {
      acc[j] = _mm256_xor_si256(
          acc[j], _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + j * 32)));
    }
  }
  alignas(32) uint64_t lanes[4 * 4];
  for (int j = 0; j < 4; ++j) _mm256_store_si256(reinterpret_cast<__m256i*>(lanes + 4 * j), acc[j]);
  return XorWords(lanes, 4 * 4);
}
#endif

// Any CPU: plain words, which the compiler vectorises for the baseline.
uint64_t XorLinesPortable(const uint8_t* p, size_t bytes) {
  uint64_t x = 0;
  for (size_t i = 0; i < bytes; i += sizeof(uint64_t)) {
    uint64_t v;
    std::memcpy(&v, p + i, sizeof(v));
    x ^= v;
  }
  return x;
}

// The widest read this CPU (and OS) runs: 2 for AVX-512, 1 for AVX2, 0 for neither.
int ReadWidth() {
  static const int width = [] {
    const std::vector<std::string_view> paths = kernels::SupportedPaths();
    auto has = [&](std::string_view name) {
      return std::find(paths.begin(), paths.end(), name) != paths.end();
    };
    return has("avx512") ? 2 : has("avx2") ? 1 : 0;
  }();
  return width;
}

template <size_t kAhead>
uint64_t XorLines(const uint8_t* p, size_t bytes) {
#if defined(__x86_64__)
  switch (ReadWidth()) {
    case 2:
      return XorLinesAvx512<kAhead>(p, bytes);
    case 1:
      return XorLinesAvx2<kAhead>(p, bytes);
    default:
      break;
  }
#endif
  return XorLinesPortable(p, bytes);
}

// Pass `pass` of the probe (kPassAhead[pass]).
uint64_t XorPass(const uint8_t* p, size_t bytes, int pass) {
  static constexpr uint64_t (*kReads[kProbePasses])(const uint8_t*, size_t) = {
      XorLines<kPassAhead[0]>, XorLines<kPassAhead[1]>, XorLines<kPassAhead[2]>};
  PD_CHECK(pass >= 0 && pass < kProbePasses);
  return kReads[pass](p, bytes);
}

}  // namespace

uint64_t XorAsProbeReads(const uint8_t* p, size_t bytes, int pass) {
  return XorPass(p, bytes, pass);
}

namespace {

// One slice per thread, whole lines, contiguous: the same split for the first touch
// (placing pages near their reader) and for every timed pass.
struct Slice {
  size_t begin, bytes;
};
Slice SliceOf(size_t lines, int thread, int threads) {
  const size_t per = lines / threads, extra = lines % threads;
  const size_t t = static_cast<size_t>(thread);
  const size_t first = t * per + std::min(t, extra);
  return {first * kLineBytes, (per + (t < extra ? 1 : 0)) * kLineBytes};
}

// Element storage of one operand: bf16 as raw bits, f32 as floats.
template <typename T>
std::vector<T> RandomOperand(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<T> v(n);
  for (T& x : v) {
    if constexpr (std::is_same_v<T, float>) {
      x = dist(rng);
    } else {
      x = F32ToBF16(dist(rng));
    }
  }
  return v;
}

template <typename T>
Result<double> RunGemm(int m, int n, int k, double seconds) {
  using dnnl::memory;
  constexpr memory::data_type kType =
      std::is_same_v<T, float> ? memory::data_type::f32 : memory::data_type::bf16;
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const memory::dims src_dims = {m, k}, weight_dims = {k, n}, dst_dims = {m, n};
  const memory::desc src_md(src_dims, kType, memory::format_tag::ab);
  // The checkpoint's [n, k] row-major weight is the [k, n] matrix in "ba" order.
  const memory::desc weight_plain_md(weight_dims, kType, memory::format_tag::ba);
  const memory::desc weight_any_md(weight_dims, kType, memory::format_tag::any);
  const memory::desc dst_md(dst_dims, memory::data_type::f32, memory::format_tag::ab);
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, weight_any_md, dst_md), engine);

  // Small random values: the rate must not depend on them, but zeros could hit fast paths.
  std::mt19937 rng(1);
  std::vector<T> src = RandomOperand<T>(static_cast<size_t>(m) * k, rng);
  std::vector<T> weight = RandomOperand<T>(static_cast<size_t>(n) * k, rng);

  memory src_mem(src_md, engine, src.data());
  memory weight_plain(weight_plain_md, engine, weight.data());
  memory weight_mem(pd.weights_desc(), engine);
  dnnl::reorder(weight_plain, weight_mem).execute(stream, weight_plain, weight_mem);
  memory dst_mem(dst_md, engine);
  const dnnl::matmul matmul(pd);
  const double best = BestRunSeconds(seconds, [&] {
    matmul.execute(
        stream, {{DNNL_ARG_SRC, src_mem}, {DNNL_ARG_WEIGHTS, weight_mem}, {DNNL_ARG_DST, dst_mem}});
    stream.wait();
  });
  return 2.0 * m * n * k / best;
}

}  // namespace

Result<double> MeasureGemmFlops(DType type, int m, int n, int k, int threads, double seconds) {
  if (m < 1 || n < 1 || k < 1) {
    return Status::InvalidArgument(
        fmt::format("GEMM sizes must be >= 1, got m={} n={} k={}", m, n, k));
  }
  if (type != DType::kBF16 && type != DType::kF32) {
    return Status::InvalidArgument(
        fmt::format("GEMM ceiling type must be bf16 or f32, got {}", DTypeFlagName(type)));
  }
  PD_RETURN_IF_ERROR(CheckDuration(seconds));
  ScopedOmpThreads omp_threads(threads);
  // oneDNN reports failures (no kernel of this type for this CPU, bad descriptors) by
  // exception; they end here.
  try {
    return type == DType::kBF16 ? RunGemm<uint16_t>(m, n, k, seconds)
                                : RunGemm<float>(m, n, k, seconds);
  } catch (const dnnl::error& e) {
    return Status::Unavailable(fmt::format("oneDNN {} matmul {}x{}x{} failed: {} (status {})",
                                           DTypeFlagName(type), m, n, k, e.what(),
                                           static_cast<int>(e.status)));
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted(
        fmt::format("out of memory for a {}x{}x{} {} matmul", m, n, k, DTypeFlagName(type)));
  }
}

Result<MemoryBandwidthProbe> MemoryBandwidthProbe::Create(size_t bytes, int threads) {
  if (bytes < kLineBytes) {
    return Status::InvalidArgument(
        fmt::format("bandwidth buffer must be at least {} bytes, got {}", kLineBytes, bytes));
  }
  bytes = bytes / kLineBytes * kLineBytes;
  // An anonymous mapping, asked to use transparent huge pages so that streaming it measures
  // DRAM rather than TLB misses (a hint: without THP the measurement still runs).
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return Status::ResourceExhausted(
        fmt::format("cannot map a {} byte buffer for the bandwidth test", bytes));
  }
  madvise(p, bytes, MADV_HUGEPAGE);
  MemoryBandwidthProbe probe(static_cast<uint8_t*>(p), bytes,
                             threads > 0 ? threads : omp_get_max_threads());
  // First touch by the thread that will read each slice (NUMA placement), non-zero bytes so
  // that no page stays the shared zero page.
  uint8_t* const data = probe.data_;
  const size_t lines = bytes / kLineBytes;
#pragma omp parallel num_threads(probe.threads_)
  {
    const Slice s = SliceOf(lines, omp_get_thread_num(), omp_get_num_threads());
    std::memset(data + s.begin, 0x5A, s.bytes);
  }
  return probe;
}

MemoryBandwidthProbe::MemoryBandwidthProbe(uint8_t* data, size_t bytes, int threads)
    : data_(data), bytes_(bytes), threads_(threads) {}

MemoryBandwidthProbe::MemoryBandwidthProbe(MemoryBandwidthProbe&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(other.bytes_), threads_(other.threads_) {}

MemoryBandwidthProbe& MemoryBandwidthProbe::operator=(MemoryBandwidthProbe&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) munmap(data_, bytes_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = other.bytes_;
    threads_ = other.threads_;
  }
  return *this;
}

MemoryBandwidthProbe::~MemoryBandwidthProbe() {
  if (data_ != nullptr) munmap(data_, bytes_);
}

double MemoryBandwidthProbe::Pass() {
  uint8_t* const data = data_;
  const size_t lines = bytes_ / kLineBytes;
  const int kind = next_kind_;
  const Clock::time_point t0 = Clock::now();
  uint64_t pass = 0;
#pragma omp parallel num_threads(threads_) reduction(^ : pass)
  {
    const Slice s = SliceOf(lines, omp_get_thread_num(), omp_get_num_threads());
    pass ^= XorPass(data + s.begin, s.bytes, kind);
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  sink_ ^= pass;
  asm volatile("" : : "r"(sink_));
  next_kind_ = (kind + 1) % kProbePasses;
  return static_cast<double>(bytes_) / seconds;
}

Result<double> MemoryBandwidthProbe::Measure(double seconds) {
  PD_RETURN_IF_ERROR(CheckDuration(seconds));
  // Passes take the reads of kPassAhead in turn; the best of all counts.
  const double best = BestRunSeconds(seconds, [&] { (void)Pass(); });
  return static_cast<double>(bytes_) / best;
}

Result<double> MeasureMemoryBandwidth(size_t bytes, int threads, double seconds) {
  PD_RETURN_IF_ERROR(CheckDuration(seconds));
  PD_ASSIGN_OR_RETURN(MemoryBandwidthProbe probe, MemoryBandwidthProbe::Create(bytes, threads));
  return probe.Measure(seconds);
}

}  // namespace pdserve
