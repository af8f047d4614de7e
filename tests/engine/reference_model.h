// ReferenceModel: a naive float64 forward pass of the supported Llama-family architectures,
// written for tests only. It shares nothing with the engine's forward (no paging, no batching,
// no oneDNN, no bf16): it reads the Hugging Face directory itself through ModelConfig and
// SafetensorsSet, holds every weight as double and runs plain loops, one token at a time over
// a per-call KV cache of doubles. It follows the Hugging Face modelling code literally, so a
// disagreement with the engine points at the engine.
// Immutable after Load: const methods are safe to call from several threads at once.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/config.h"

namespace pdserve::testing {

class ReferenceModel {
 public:
  // Reads DIR/config.json and DIR/*.safetensors (any of F32/F16/BF16) and widens every weight
  // to double. Errors (unsupported architecture, missing tensor, wrong shape) pass through
  // from the loader and name the file and tensor.
  static Result<ReferenceModel> Load(const std::string& dir);

  const ModelConfig& config() const { return config_; }

  // Logits of the last position after running `tokens` from position 0.
  // Precondition: tokens is non-empty and every id is in [0, vocab_size).
  std::vector<double> Logits(std::span<const int32_t> tokens) const;
  // Logits of every position (row i: after tokens[0..i]), for chunked-prefill comparisons.
  std::vector<std::vector<double>> AllLogits(std::span<const int32_t> tokens) const;
  // Greedy continuation of `prompt` by n tokens (argmax; ties go to the lowest id). No stop
  // on EOS: exactly n ids come back.
  std::vector<int32_t> Greedy(std::span<const int32_t> prompt, int n) const;

  // The rotary inverse frequencies theta^(-2i/d), i in [0, d/2), after the config's rope
  // scaling (Llama-3 smooth interpolation or linear), as Hugging Face computes them.
  static std::vector<double> RopeInverseFrequencies(const ModelConfig& config);

 private:
  struct Layer {
    std::vector<double> input_norm, post_norm;   // [hidden]
    std::vector<double> q_proj, k_proj, v_proj;  // [out, hidden]
    std::vector<double> q_bias, k_bias, v_bias;  // empty unless config.qkv_bias
    std::vector<double> q_norm, k_norm;          // [head_dim], empty unless config.qk_norm
    std::vector<double> o_proj;                  // [hidden, heads * head_dim]
    std::vector<double> o_bias;                  // attention_bias outside Qwen2 (HF semantics)
    std::vector<double> gate_proj, up_proj;      // [intermediate, hidden]
    std::vector<double> down_proj;               // [hidden, intermediate]
  };
  // Keys and values (after RoPE for keys) of every position seen so far, per layer, each
  // position a row of kv_heads * head_dim.
  struct KvCache {
    std::vector<std::vector<std::vector<double>>> k, v;  // [layer][position][kv_dim]
  };

  ReferenceModel() = default;

  // Runs one token at position kv->k[0].size() and appends its keys and values; returns the
  // final-normed hidden state of that position.
  std::vector<double> Step(int32_t token, KvCache* kv) const;
  std::vector<double> Attention(const Layer& layer, int layer_index, const std::vector<double>& x,
                                int position, KvCache* kv) const;
  std::vector<double> Mlp(const Layer& layer, const std::vector<double>& x) const;
  std::vector<double> LmHead(const std::vector<double>& hidden) const;
  void ApplyRope(double* head, int position) const;
  KvCache EmptyCache() const;

  ModelConfig config_;
  std::vector<double> embed_;       // [vocab, hidden]
  std::vector<double> lm_head_;     // [vocab, hidden]; empty when tied (use embed_)
  std::vector<double> final_norm_;  // [hidden]
  std::vector<Layer> layers_;
  std::vector<double> inv_freq_;  // [head_dim / 2]
};

}  // namespace pdserve::testing
