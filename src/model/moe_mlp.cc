#include "model/moe_mlp.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "kernels/kernels.h"

namespace pdserve {
namespace {

// The workspace buffers of an MoeMlp pass.
enum Buffer : int {
  kNormed,      // [rows][hidden]
  kLogits,      // [rows][num_experts]
  kInput,       // [slots][hidden]: the normed rows, grouped per expert
  kGateUp,      // [largest group][2 * local]
  kActivation,  // [slots][expert_intermediate]
  kExpertOut,   // [slots][hidden]
  kOutput,      // [rows][hidden]
};

}  // namespace

MoeMlp::MoeMlp(const ModelConfig& config, const TpSlices& tp, int layer, LayerWeights& w,
               MatrixPacker& packer)
    : config_(config), tp_(tp), layer_(layer), post_norm_(w.post_norm) {
  const int num_experts = config.moe.num_experts;
  packer.Add({{&w.router, {0, num_experts}}}, &router_);
  experts_.resize(num_experts);
  for (int e = 0; e < num_experts; ++e) {
    ExpertWeights& x = w.experts[e];
    packer.Add({{&x.gate_proj, tp.expert_intermediate}, {&x.up_proj, tp.expert_intermediate}},
               &experts_[e].gate_up);
    packer.Add({{&x.down_proj, tp.hidden}}, &experts_[e].down);
  }
}

size_t MoeMlp::WeightBytes() const {
  size_t bytes = router_.bytes();
  for (const Expert& e : experts_) bytes += e.gate_up.bytes() + e.down.bytes();
  return bytes;
}

size_t MoeMlp::StepWeightBytes(const RoutingTrace& trace) const {
  size_t bytes = router_.bytes();
  for (const RoutingTrace::Layer& l : trace.layers) {
    if (l.layer != layer_) continue;
    std::vector<bool> hit(experts_.size(), false);
    for (int32_t e : l.experts) hit[e] = true;
    for (size_t e = 0; e < experts_.size(); ++e) {
      if (hit[e]) bytes += experts_[e].gate_up.bytes() + experts_[e].down.bytes();
    }
  }
  return bytes;
}

void MoeMlp::Route(const float* logits, int rows) {
  const int num_experts = config_.moe.num_experts;
  const int k = config_.moe.experts_per_token;
  const size_t slots = static_cast<size_t>(rows) * k;
  choice_.resize(slots);
  weight_.resize(slots);
  slot_row_.resize(slots);
  row_slot_.resize(slots);
  group_begin_.assign(num_experts + 1, 0);
  std::vector<int32_t> order(num_experts);
  std::vector<double> prob(num_experts);
  for (int r = 0; r < rows; ++r) {
    const float* l = logits + static_cast<size_t>(r) * num_experts;
    // Softmax over every expert (Hugging Face normalises over all of them, then picks).
    const float top = *std::max_element(l, l + num_experts);
    double sum = 0;
    for (int e = 0; e < num_experts; ++e)
      sum += prob[e] = std::exp(static_cast<double>(l[e] - top));
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    double chosen = 0;
    for (int j = 0; j < k; ++j) chosen += prob[order[j]] / sum;
    for (int j = 0; j < k; ++j) {
      const double p = prob[order[j]] / sum;
      choice_[r * k + j] = order[j];
      weight_[r * k + j] = static_cast<float>(config_.moe.norm_topk_prob ? p / chosen : p);
      ++group_begin_[order[j] + 1];
    }
  }
  std::partial_sum(group_begin_.begin(), group_begin_.end(), group_begin_.begin());
  // Slots in expert order, rows ascending inside each expert.
  std::vector<int> next(group_begin_.begin(), group_begin_.end() - 1);
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < k; ++j) {
      const int slot = next[choice_[r * k + j]]++;
      slot_row_[slot] = r;
      row_slot_[r * k + j] = slot;
    }
  }
}

Status MoeMlp::Run(ForwardPass& pass) {
  const int rows = pass.rows;
  const int hidden = config_.hidden_size;
  const int num_experts = config_.moe.num_experts;
  const int k = config_.moe.experts_per_token;
  const int inter = config_.moe.expert_intermediate;
  const int local = tp_.expert_intermediate.size();  // this rank's gate and up columns
  Workspace& ws = pass.workspace;

  float* h = ws.Floats(kNormed, static_cast<size_t>(rows) * hidden);
  kernels::RmsNorm(pass.x, post_norm_.as<float>(), h, rows, hidden,
                   static_cast<float>(config_.rms_norm_eps));
  float* logits = ws.Floats(kLogits, static_cast<size_t>(rows) * num_experts);
  pass.linear.Linear(h, rows, router_, logits);
  Route(logits, rows);
  if (pass.routing != nullptr) {
    pass.routing->layers.push_back({.layer = layer_,
                                    .rows = rows,
                                    .experts_per_token = k,
                                    .experts = choice_,
                                    .weights = weight_});
  }

  // Each slot's input row, grouped per expert, then each hit expert's gate|up product.
  const int slots = rows * k;
  float* input = ws.Floats(kInput, static_cast<size_t>(slots) * hidden);
  for (int s = 0; s < slots; ++s) {
    std::memcpy(input + static_cast<size_t>(s) * hidden,
                h + static_cast<size_t>(slot_row_[s]) * hidden, hidden * sizeof(float));
  }
  int largest = 0;
  for (int e = 0; e < num_experts; ++e) {
    largest = std::max(largest, group_begin_[e + 1] - group_begin_[e]);
  }
  float* gate_up = ws.Floats(kGateUp, static_cast<size_t>(largest) * 2 * local);
  float* act = ws.Floats(kActivation, static_cast<size_t>(slots) * inter);
  for (int e = 0; e < num_experts && local > 0; ++e) {
    const int begin = group_begin_[e], n = group_begin_[e + 1] - begin;
    if (n == 0) continue;
    pass.linear.Linear(input + static_cast<size_t>(begin) * hidden, n, experts_[e].gate_up,
                       gate_up);
    for (int t = 0; t < n; ++t) {
      const float* g = gate_up + static_cast<size_t>(t) * 2 * local;
      kernels::SiluMul(g, g + local,
                       act + static_cast<size_t>(begin + t) * inter + tp_.expert_intermediate.begin,
                       local);
    }
  }
  PD_RETURN_IF_ERROR(pass.linear.GatherColumns(act, slots, inter, tp_.expert_intermediate));

  // Each hit expert's down product, this rank's output columns of every slot, one gather.
  float* expert_out = ws.Floats(kExpertOut, static_cast<size_t>(slots) * hidden);
  for (int e = 0; e < num_experts; ++e) {
    const int begin = group_begin_[e], n = group_begin_[e + 1] - begin;
    if (n == 0) continue;
    pass.linear.LinearIntoColumns(act + static_cast<size_t>(begin) * inter, n, experts_[e].down,
                                  tp_.hidden, hidden,
                                  expert_out + static_cast<size_t>(begin) * hidden);
  }
  PD_RETURN_IF_ERROR(pass.linear.GatherColumns(expert_out, slots, hidden, tp_.hidden));

  // Each row's weighted sum, in the router's order.
  float* out = ws.Floats(kOutput, static_cast<size_t>(rows) * hidden);
#pragma omp parallel for schedule(static) if (static_cast <int64_t>(rows) * hidden * k >= 65536)
  for (int r = 0; r < rows; ++r) {
    float* y = out + static_cast<size_t>(r) * hidden;
    std::fill(y, y + hidden, 0.0f);
    for (int j = 0; j < k; ++j) {
      const float w = weight_[r * k + j];
      const float* o = expert_out + static_cast<size_t>(row_slot_[r * k + j]) * hidden;
      for (int d = 0; d < hidden; ++d) y[d] += w * o[d];
    }
  }
  pass.AddToResidual(out);
  return Status::Ok();
}

}  // namespace pdserve
