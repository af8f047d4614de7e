// The products of the "amx" kernel path: the AMX tile kernel (amx_kernel.inc) on the tile
// registers (AMX-TILE, AMX-BF16). This file alone is compiled with -mamx-tile -mamx-bf16;
// dispatch.cc runs it only where CPUID, XCR0 and the OS (Linux's ARCH_REQ_XCOMP_PERM) allow,
// and pairs it with the avx512 path's other kernels. See kernel_table.h for the rule that keeps
// its code out of the other paths.
#include <immintrin.h>

#include "kernels/amx_model.h"
#include "kernels/kernel_table.h"

namespace pdserve::kernels {
namespace {

using internal::kBlockGroups;
using internal::kGroupCols;
using internal::kMaxTileColsb;
using internal::kMaxTileRows;
using internal::kPairElems;
using internal::TileConfig;

#include "kernels/amx_kernel.inc"

// The tile interface of amx_kernel.inc on the real registers. The intrinsics are macros that
// paste the tile number into the instruction, so each needs a literal: one case per tile the
// kernel uses.
struct HardwareTiles {
  void LoadConfig(const TileConfig& config) { _tile_loadconfig(&config); }
  void Release() { _tile_release(); }
  template <int T>
  void Zero() {
    static_assert(T >= kTileC && T < kTileC + 4);
    if constexpr (T == 0) _tile_zero(0);
    if constexpr (T == 1) _tile_zero(1);
    if constexpr (T == 2) _tile_zero(2);
    if constexpr (T == 3) _tile_zero(3);
  }
  template <int T>
  void Load(const void* base, size_t stride) {
    static_assert(T == kTileA || T == kTileB || T == kTileB + 1);
    if constexpr (T == 4) _tile_loadd(4, base, stride);
    if constexpr (T == 5) _tile_loadd(5, base, stride);
    if constexpr (T == 6) _tile_loadd(6, base, stride);
  }
  template <int T>
  void Store(void* base, size_t stride) {
    static_assert(T >= kTileC && T < kTileC + 4);
    if constexpr (T == 0) _tile_stored(0, base, stride);
    if constexpr (T == 1) _tile_stored(1, base, stride);
    if constexpr (T == 2) _tile_stored(2, base, stride);
    if constexpr (T == 3) _tile_stored(3, base, stride);
  }
  template <int C, int A, int B>
  void DotBF16() {
    static_assert(kTileC == 0 && kTileA == 4 && kTileB == 5);
    static_assert(C >= 0 && C < 4 && A == 4 && (B == 5 || B == 6));
    if constexpr (C == 0 && B == 5) _tile_dpbf16ps(0, 4, 5);
    if constexpr (C == 0 && B == 6) _tile_dpbf16ps(0, 4, 6);
    if constexpr (C == 1 && B == 5) _tile_dpbf16ps(1, 4, 5);
    if constexpr (C == 1 && B == 6) _tile_dpbf16ps(1, 4, 6);
    if constexpr (C == 2 && B == 5) _tile_dpbf16ps(2, 4, 5);
    if constexpr (C == 2 && B == 6) _tile_dpbf16ps(2, 4, 6);
    if constexpr (C == 3 && B == 5) _tile_dpbf16ps(3, 4, 5);
    if constexpr (C == 3 && B == 6) _tile_dpbf16ps(3, 4, 6);
  }
};

void PackedTile(const uint16_t* x, const uint16_t* block, float* y, int n, int k, int c0, int t0,
                int groups, int tokens, internal::BlockAhead /*ahead: not used*/) {
  HardwareTiles tiles;
  AmxPackedTile(tiles, x, block, y, n, k, c0, t0, groups, tokens);
}

}  // namespace

namespace internal {
// Products only: the other entries stay null (dispatch.cc copies them from the base path).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
const KernelTable kAmxKernels = {
    .name = "amx",
    .packed_tile = PackedTile,
    .packed_tile_tokens = kAmxTokens,
};
#pragma GCC diagnostic pop
}  // namespace internal

}  // namespace pdserve::kernels
