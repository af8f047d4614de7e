// ForwardPass: one forward pass as the blocks of each layer see it (model/block.h): the chunks
// of the batch, one token row per chunk token, the residual stream the blocks update, and this
// rank's products and scratch. Transformer::Forward builds it and hands it to each block in
// turn, on the forward thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kv/kv_cache.h"
#include "kv/layout.h"
#include "model/rope.h"
#include "model/tp_linear.h"

namespace pdserve {

// Tokens [start, start + tokens.size()) of one sequence. `pages` must already cover positions
// [0, start + tokens.size()); positions before `start` must already be in the cache.
struct SequenceChunk {
  std::span<const int32_t> tokens;
  int64_t start = 0;
  std::span<const PageId> pages;
  bool want_logits = false;  // logits of the chunk's last token
  // With want_logits: logits of the chunk's last `logit_rows` tokens (1 .. tokens.size()), in
  // order — how speculative decoding verifies drafted tokens in one pass.
  int logit_rows = 1;
  // Speculative decoding with the MTP module (TransformerOptions::mtp_kv): the MTP entry of each
  // of the chunk's first mtp_tokens.size() rows, its KV written to layer num_layers, from the
  // row's hidden state and the token after it, mtp_tokens[row] (Transformer::ForwardMtp).
  std::span<const int32_t> mtp_tokens = {};
  // The final-normed hidden states of the chunk's last `hidden_rows` tokens go to Forward's
  // `hidden`, in chunk order (what an MTP draft starts from).
  int hidden_rows = 0;
};

// Float buffers that the blocks of a pass share for their intermediates: a block may use any of
// them, only inside its Run (the next block overwrites them). They only grow, so they end up
// sized for the largest batch seen and a step of another size costs no allocation or fill.
class Workspace {
 public:
  static constexpr int kBuffers = 8;
  // Buffer `i` (< kBuffers) with room for at least `count` floats; its contents are unspecified.
  float* Floats(int i, size_t count) {
    std::vector<float>& b = buffers_[i];
    if (b.size() < count) b.resize(count);
    return b.data();
  }

 private:
  std::array<std::vector<float>, kBuffers> buffers_;
};

// What the MoE layers of a pass chose (Transformer::set_routing_trace), for the tests that
// compare routing with a reference and for the benchmarks that count the experts a step reads.
struct RoutingTrace {
  struct Layer {
    int layer = 0;
    int rows = 0;
    int experts_per_token = 0;
    std::vector<int32_t> experts;  // [rows][experts_per_token], in the router's order
    std::vector<float> weights;    // [rows][experts_per_token]: each choice's weight in the sum
  };
  std::vector<Layer> layers;  // one per MoE layer, in layer order
};

struct ForwardPass {
  std::span<const SequenceChunk> chunks;
  KvCache& cache;
  int rows = 0;                        // token rows: the chunks' tokens, chunk after chunk
  int hidden = 0;                      // the model's hidden size
  std::span<const int64_t> positions;  // [rows]: each row's position in its sequence
  std::span<const int> row_chunk;      // [rows]: the chunk each row belongs to
  const RopeAngles& rope;              // the angles of each row's position
  float* x;                            // [rows][hidden]: the residual stream
  TpLinear& linear;                    // this rank's products and gathers
  Workspace& workspace;
  RoutingTrace* routing = nullptr;  // when set, the MoE layers append their choices

  const SequenceChunk& chunk_of(int row) const { return chunks[row_chunk[row]]; }
  // x += y, y being [rows][hidden]: how a block adds its output to the residual stream.
  void AddToResidual(const float* y) {
    const size_t n = static_cast<size_t>(rows) * hidden;
    for (size_t i = 0; i < n; ++i) x[i] += y[i];
  }
};

}  // namespace pdserve
