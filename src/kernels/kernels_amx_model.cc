// The products of the "amx-model" kernel path: the AMX tile kernel (amx_kernel.inc) run on the
// software model of the tile instructions (amx_model.h), for CPUs without AMX. Plain C++,
// compiled for any CPU; slow by nature (every tile FMA is a call). dispatch.cc pairs it with
// the other kernels of the best path the CPU runs.
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

// The tile interface of amx_kernel.inc over one TileMachine.
struct ModelTiles {
  internal::TileMachine machine;
  void LoadConfig(const TileConfig& config) { machine.LoadConfig(config); }
  void Release() { machine.Release(); }
  template <int T>
  void Zero() {
    machine.Zero(T);
  }
  template <int T>
  void Load(const void* base, size_t stride) {
    machine.Load(T, base, stride);
  }
  template <int T>
  void Store(void* base, size_t stride) {
    machine.Store(T, base, stride);
  }
  template <int C, int A, int B>
  void DotBF16() {
    machine.DotBF16(C, A, B);
  }
};

void PackedTile(const uint16_t* x, const uint16_t* block, float* y, int n, int k, int c0, int t0,
                int groups, int tokens, internal::BlockAhead /*ahead: not used*/) {
  ModelTiles tiles;  // one thread's tile registers, as the hardware keeps them per thread
  AmxPackedTile(tiles, x, block, y, n, k, c0, t0, groups, tokens);
}

}  // namespace

namespace internal {
// Products only: the other entries stay null (dispatch.cc copies them from the base path).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
const KernelTable kAmxModelKernels = {
    .name = "amx-model",
    .packed_tile = PackedTile,
    .packed_tile_tokens = kAmxTokens,
};
#pragma GCC diagnostic pop
}  // namespace internal

}  // namespace pdserve::kernels
