// Block quantisation of weight matrices to 8 bits, shared by the synthetic writer
// (`make-model --dtype fp8|int8`) and the loader (`--weights fp8|int8` on a checkpoint of
// another format), so that a matrix quantised at load holds exactly the bytes and scales that
// make-model writes for it. Pure functions; safe from any thread.
#pragma once

#include <cstdint>
#include <string_view>

namespace pdserve {

// Rows and columns of an FP8 block (weight_block_size [128, 128], as DeepSeek-V3 ships), and
// columns of an INT8 block (one row each).
inline constexpr int kQuantBlock = 128;

// Whether the matrix named `name` (a Hugging Face tensor name) is one an 8-bit checkpoint holds
// quantised, as DeepSeek's FP8 checkpoints do: the linear layers' weights, i.e. every matrix
// but the embedding, the lm_head, the MoE router (mlp.gate) and the MTP modules' eh_proj and
// copies of the embedding and lm_head.
bool IsQuantisedLinearName(std::string_view name);

// FP8 (float8_e4m3fn) in 128 x 128 blocks: each block's scale is max|w| / 448 (1 for a block of
// zeros), each value the nearest FP8 of w / scale. `w` holds `rows` rows of `cols` values that
// start on a multiple of 128 rows of their matrix; writes their bytes and the scales of their
// blocks, [ceil(rows / 128)][ceil(cols / 128)].
void QuantiseFp8Rows(const float* w, int64_t rows, int64_t cols, uint8_t* out, float* block_scales);

// INT8, symmetric, per row and 128-wide block of columns: the scale is max|w| / 127 over the
// block (1 for zeros), each value w / scale rounded to nearest even (so within [-127, 127]).
// Writes `rows` x `cols` bytes and the row scales [rows][ceil(cols / 128)].
void QuantiseInt8Rows(const float* w, int64_t rows, int64_t cols, int8_t* out, float* row_scales);

}  // namespace pdserve
