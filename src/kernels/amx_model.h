// A software model of the Intel AMX tile instructions the AMX kernel uses (LDTILECFG palette 1,
// TILEZERO, TILELOADD, TILESTORED, TDPBF16PS, TILERELEASE), bit-exact to their documented
// semantics, so that the AMX kernel's blocking and accumulation order run, and are tested, on
// CPUs without AMX (the "amx-model" kernel path, dispatch.h). For src/kernels and its tests.
// One TileMachine is one thread's tile state, as the real registers are: use an object from one
// thread at a time.
//
// Semantics modelled, from the Intel 64 and IA-32 Architectures Software Developer's Manual
// (SDM), vol. 2 (instruction pages) and vol. 1 (its AMX chapter), and the SDM's TDPBF16PS
// pseudocode:
//  - Palette 1: 8 tiles of at most 16 rows x 64 bytes. LDTILECFG takes the 64-byte TileConfig
//    below; reserved bytes must be zero and start_row 0 here; rows/colsb of each tile within
//    the palette's limits; it zeroes every tile. Palette 0 (or TILERELEASE) returns to the
//    init state, where tile instructions fault (#UD).
//  - TILELOADD: row r of the tile = colsb bytes at base + r * stride; bytes beyond colsb and
//    rows beyond `rows` read as zero. TILESTORED writes rows x colsb bytes, nothing else.
//  - TDPBF16PS C, A, B (C: M x N fp32, A: M x K bf16 pairs, B: K x N bf16 pairs), per row m:
//        even[n] = odd[n] = +0
//        for k in 0 .. A.colsb/4 - 1, for n: (FP32 FMA, DAZ=FTZ=1, RNE)
//            even[n] += fp32(A[m].bf16[2k])   * fp32(B[k].bf16[2n])
//            odd[n]  += fp32(A[m].bf16[2k+1]) * fp32(B[k].bf16[2n+1])
//        C[m][n] = C[m][n] + (even[n] + odd[n])   (each addition DAZ=FTZ=1, RNE)
//    So one instruction keeps two separate chains per output (even and odd elements of the
//    pairs, each a chain of FMAs over k in order), adds them, and adds that to the accumulator.
//    (The Intrinsics Guide's shorter pseudocode, one chain alternating even and odd products,
//    differs; we follow the SDM, the instruction's definition.) DAZ: an input denormal (a bf16
//    or an fp32 accumulator) is taken as a zero of its sign. FTZ: a tiny result becomes a zero
//    of its sign. The TDPBF16PS page does not say when a result is tiny; we take x86 SSE's rule,
//    after rounding (as Berkeley SoftFloat's 8086-SSE model does): it differs from "the result
//    is denormal" only for an FMA whose exact value lies just below 2^-126. MXCSR is neither
//    read nor written, and no exception is raised.
//  - Shape rules (SDM, exception class AMX-E4): #UD unless the three tiles are distinct and
//    configured, C.colsb == B.colsb, C.rows == A.rows, A.colsb / 4 == B.rows, all colsb
//    multiples of 4. The model aborts (PD_CHECK) where the CPU raises #UD: a programmer error.
// Not modelled: NaN payloads (the TDPBF16PS page gives no NaN priorities; any NaN is
// a NaN here), start_row restarts after a fault, and TSX aborts.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pdserve::kernels::internal {

// The 64-byte memory operand of LDTILECFG (SDM vol. 2, LDTILECFG: "Tile Configuration").
// A plain aggregate (no inline constructor for an ISA file to share): value-initialise it, {}.
struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];  // bytes per row of tile i (tiles 8..15 must stay 0 in palette 1)
  uint8_t rows[16];
};
static_assert(sizeof(TileConfig) == 64);

constexpr int kNumTiles = 8;      // palette 1
constexpr int kMaxTileRows = 16;  // palette 1
constexpr int kMaxTileColsb = 64;

// One FP32 fused multiply-add a * b + c as TDPBF16PS performs it: DAZ on a, b and c, one
// rounding to nearest even, FTZ (tininess after rounding) on the result.
float FmaDazFtz(float a, float b, float c);
// a + b with DAZ on both, round to nearest even, FTZ on the result.
float AddDazFtz(float a, float b);

class TileMachine {
 public:
  // LDTILECFG / TILERELEASE.
  void LoadConfig(const TileConfig& config);
  void Release();
  void Zero(int tile);
  void Load(int tile, const void* base, size_t stride);
  void Store(int tile, void* base, size_t stride) const;
  void DotBF16(int c, int a, int b);

 private:
  void CheckConfigured(int tile) const;

  bool configured_ = false;
  TileConfig config_{};
  alignas(64) uint8_t data_[kNumTiles][kMaxTileRows][kMaxTileColsb] = {};
};

}  // namespace pdserve::kernels::internal
