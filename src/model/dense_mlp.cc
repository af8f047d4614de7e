#include "model/dense_mlp.h"

#include <cstdint>

#include "kernels/kernels.h"

namespace pdserve {
namespace {

// The workspace buffers of a DenseMlp pass.
enum Buffer : int { kNormed, kGateUp, kActivation, kOutput };

}  // namespace

DenseMlp::DenseMlp(const ModelConfig& config, const TpSlices& tp, LayerWeights& w,
                   MatrixPacker& packer)
    : config_(config), tp_(tp), post_norm_(w.post_norm) {
  packer.Add({{&w.gate_proj, tp.intermediate}, {&w.up_proj, tp.intermediate}}, &gate_up_);
  packer.Add({{&w.down_proj, tp.hidden}}, &down_);
}

Status DenseMlp::Run(ForwardPass& pass) {
  const int total = pass.rows;
  const int hidden = config_.hidden_size;
  const int inter = config_.intermediate_size;
  const int local = tp_.intermediate.size();  // this rank's gate and up columns
  Workspace& ws = pass.workspace;

  float* h = ws.Floats(kNormed, static_cast<size_t>(total) * hidden);
  kernels::RmsNorm(pass.x, post_norm_.as<float>(), h, total, hidden,
                   static_cast<float>(config_.rms_norm_eps));
  float* gate_up = ws.Floats(kGateUp, static_cast<size_t>(total) * 2 * local);
  float* act = ws.Floats(kActivation, static_cast<size_t>(total) * inter);
  if (local > 0) {  // a rank may hold no column of them (more ranks than columns to share)
    pass.linear.Linear(h, total, gate_up_, gate_up);
#pragma omp parallel for schedule(static) if (static_cast <int64_t>(total) * local >= 65536)
    for (int t = 0; t < total; ++t) {
      const float* g = gate_up + static_cast<size_t>(t) * 2 * local;
      kernels::SiluMul(g, g + local, act + static_cast<size_t>(t) * inter + tp_.intermediate.begin,
                       local);
    }
  }
  PD_RETURN_IF_ERROR(pass.linear.GatherColumns(act, total, inter, tp_.intermediate));
  float* out = ws.Floats(kOutput, static_cast<size_t>(total) * hidden);
  PD_RETURN_IF_ERROR(pass.linear.ColumnParallelLinear(act, total, down_, tp_.hidden, hidden, out));
  pass.AddToResidual(out);
  return Status::Ok();
}

}  // namespace pdserve
