#include "model/moe_mlp.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <vector>

#include "kernels/kernels.h"

namespace pdserve {
namespace {

// The workspace buffers of an MoeMlp pass.
enum Buffer : int {
  kNormed,      // [rows][hidden]
  kLogits,      // [rows][num_experts]; after routing, the shared experts' output [rows][hidden]
  kInput,       // [slots][hidden]: the normed rows, grouped per expert
  kGateUp,      // [largest group][2 * local]
  kActivation,  // [slots][expert_intermediate]
  kExpertOut,   // [slots][hidden]
  kOutput,      // [rows][hidden]
};
// The shared experts' SwiGlu runs after the routed ones and uses kInput and kGateUp, free then.
constexpr int kSharedOutput = kLogits;
constexpr int kSharedScratch = kInput;
static_assert(kSharedScratch + 1 == kGateUp);

}  // namespace

MoeMlp::MoeMlp(const ModelConfig& config, const TpSlices& tp, int layer, LayerWeights& w,
               MatrixPacker& packer)
    : config_(config),
      tp_(tp),
      layer_(layer),
      post_norm_(w.post_norm),
      router_bias_(w.router_bias) {
  const int num_experts = config.moe.num_experts;
  packer.Add({{&w.router, {0, num_experts}}}, &router_);
  if (config.moe.shared_experts > 0) {
    shared_ = std::make_unique<SwiGlu>(w.shared.gate_proj, w.shared.up_proj, w.shared.down_proj,
                                       config.moe.expert_intermediate * config.moe.shared_experts,
                                       tp.shared_intermediate, tp.hidden, packer);
  }
  experts_.resize(num_experts);
  for (int e = 0; e < num_experts; ++e) {
    ExpertWeights& x = w.experts[e];
    packer.Add({{&x.gate_proj, tp.expert_intermediate}, {&x.up_proj, tp.expert_intermediate}},
               &experts_[e].gate_up);
    packer.Add({{&x.down_proj, tp.hidden}}, &experts_[e].down);
  }
}

size_t MoeMlp::WeightBytes() const {
  size_t bytes = router_.bytes() + (shared_ ? shared_->WeightBytes() : 0);
  for (const Expert& e : experts_) bytes += e.gate_up.bytes() + e.down.bytes();
  return bytes;
}

size_t MoeMlp::StepWeightBytes(const RoutingTrace& trace) const {
  size_t bytes = router_.bytes() + (shared_ ? shared_->WeightBytes() : 0);
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
  const MoeConfig& m = config_.moe;
  const int num_experts = m.num_experts;
  const int k = m.experts_per_token;
  const size_t slots = static_cast<size_t>(rows) * k;
  choice_.resize(slots);
  weight_.resize(slots);
  slot_row_.resize(slots);
  row_slot_.resize(slots);
  group_begin_.assign(num_experts + 1, 0);
  const bool softmax = m.scoring == MoeConfig::Scoring::kSoftmax;
  const bool biased = m.topk_method == MoeConfig::TopK::kNoAuxTc;
  // Hugging Face's DeepSeek gates renormalise only a top-k of more than one; Qwen3-MoE's always.
  const bool normalise = m.norm_topk_prob && (k > 1 || config_.arch == Architecture::kQwen3Moe);
  const bool scale = !(m.scale_only_unnormalised && normalise);
  const float* bias = biased ? router_bias_.as<float>() : nullptr;
  std::vector<int32_t> order(num_experts);
  std::vector<double> score(num_experts), choice(num_experts);
  const int groups = m.topk_method == MoeConfig::TopK::kGreedy ? 1 : m.n_group;
  const int per_group = num_experts / groups;
  std::vector<double> group_score(groups);
  std::vector<int> group_order(groups);
  auto by_value = [](const std::vector<double>& v) {
    return [&v](int a, int b) { return v[a] > v[b] || (v[a] == v[b] && a < b); };
  };
  for (int r = 0; r < rows; ++r) {
    const float* l = logits + static_cast<size_t>(r) * num_experts;
    // Scores: softmax over every expert (normalised over all, then picked) or sigmoids.
    if (softmax) {
      const float top = *std::max_element(l, l + num_experts);
      double sum = 0;
      for (int e = 0; e < num_experts; ++e) {
        sum += score[e] = std::exp(static_cast<double>(l[e]) - top);
      }
      for (double& x : score) x /= sum;
    } else {
      for (int e = 0; e < num_experts; ++e) score[e] = 1.0 / (1.0 + std::exp(-double{l[e]}));
    }
    // What the choice compares: the logits where that is the same order as the scores (exact,
    // so that no rounding of exp decides between two experts), else the scores, plus
    // noaux_tc's correction bias (which chooses but does not weight).
    for (int e = 0; e < num_experts; ++e) {
      choice[e] = softmax && !biased ? double{l[e]} : score[e] + (biased ? bias[e] : 0.0);
    }
    if (groups > 1) {
      // Each group's score (its best choice value; noaux_tc: the sum of its best two), the
      // topk_group best groups kept and the others' experts out of the running (DeepSeek's
      // reference masks them with -inf, not with 0 as Hugging Face's port does).
      for (int g = 0; g < groups; ++g) {
        const double* c = &choice[static_cast<size_t>(g) * per_group];
        std::vector<double> sorted(c, c + per_group);
        std::partial_sort(sorted.begin(), sorted.begin() + std::min(2, per_group), sorted.end(),
                          std::greater<>());
        group_score[g] = biased ? sorted[0] + sorted[1] : sorted[0];
      }
      std::iota(group_order.begin(), group_order.end(), 0);
      std::partial_sort(group_order.begin(), group_order.begin() + m.topk_group, group_order.end(),
                        by_value(group_score));
      std::vector<bool> kept(groups, false);
      for (int g = 0; g < m.topk_group; ++g) kept[group_order[g]] = true;
      for (int e = 0; e < num_experts; ++e) {
        if (!kept[e / per_group]) choice[e] = -INFINITY;
      }
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), by_value(choice));
    double chosen = 0;
    for (int j = 0; j < k; ++j) chosen += score[order[j]];
    for (int j = 0; j < k; ++j) {
      double w = score[order[j]];
      if (normalise) w /= chosen;
      if (scale) w *= m.routed_scaling_factor;
      choice_[r * k + j] = order[j];
      weight_[r * k + j] = static_cast<float>(w);
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
  // The hit experts' gate|up products in one pass, then SiLU(gate) * up of every slot.
  std::vector<TpLinear::RowGroup> gate_up_groups, down_groups;
  for (int e = 0; e < num_experts; ++e) {
    const int begin = group_begin_[e], n = group_begin_[e + 1] - begin;
    if (n == 0) continue;
    gate_up_groups.push_back({begin, n, &experts_[e].gate_up});
    down_groups.push_back({begin, n, &experts_[e].down});
  }
  float* gate_up = ws.Floats(kGateUp, static_cast<size_t>(slots) * 2 * local);
  float* act = ws.Floats(kActivation, static_cast<size_t>(slots) * inter);
  if (local > 0) {
    pass.linear.GroupedLinear(input, gate_up_groups, gate_up);
#pragma omp parallel for schedule(static) if (static_cast <int64_t>(slots) * local >= 65536)
    for (int s = 0; s < slots; ++s) {
      const float* g = gate_up + static_cast<size_t>(s) * 2 * local;
      kernels::SiluMul(g, g + local,
                       act + static_cast<size_t>(s) * inter + tp_.expert_intermediate.begin, local);
    }
  }
  PD_RETURN_IF_ERROR(pass.linear.GatherColumns(act, slots, inter, tp_.expert_intermediate));

  // The hit experts' down products, this rank's output columns of every slot, one gather.
  float* expert_out = ws.Floats(kExpertOut, static_cast<size_t>(slots) * hidden);
  pass.linear.GroupedLinearIntoColumns(act, down_groups, tp_.hidden, hidden, expert_out);
  PD_RETURN_IF_ERROR(pass.linear.GatherColumns(expert_out, slots, hidden, tp_.hidden));
  const float* shared = nullptr;
  if (shared_) {
    float* s = ws.Floats(kSharedOutput, static_cast<size_t>(rows) * hidden);
    PD_RETURN_IF_ERROR(shared_->Apply(pass, h, rows, s, kSharedScratch));
    shared = s;
  }

  // Each row's weighted sum, in the router's order, then the shared experts' output.
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
    if (shared != nullptr) {
      const float* o = shared + static_cast<size_t>(r) * hidden;
      for (int d = 0; d < hidden; ++d) y[d] += o[d];
    }
  }
  pass.AddToResidual(out);
  return Status::Ok();
}

}  // namespace pdserve
