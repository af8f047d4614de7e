#include "model/dense_mlp.h"

#include <cstdint>

#include "kernels/kernels.h"

namespace pdserve {

SwiGlu::SwiGlu(Tensor& gate, Tensor& up, Tensor& down, int width, DimRange inter, DimRange hidden,
               MatrixPacker& packer)
    : width_(width), inter_(inter), hidden_(hidden) {
  packer.Add({{&gate, inter}, {&up, inter}}, &gate_up_);
  packer.Add({{&down, hidden}}, &down_);
}

Status SwiGlu::Apply(ForwardPass& pass, const float* h, int rows, float* out, int scratch) const {
  const int local = inter_.size();  // this rank's gate and up columns
  Workspace& ws = pass.workspace;
  float* gate_up = ws.Floats(scratch, static_cast<size_t>(rows) * 2 * local);
  float* act = ws.Floats(scratch + 1, static_cast<size_t>(rows) * width_);
  if (local > 0) {  // a rank may hold no column of them (more ranks than columns to share)
    pass.linear.Linear(h, rows, gate_up_, gate_up);
#pragma omp parallel for schedule(static) if (static_cast <int64_t>(rows) * local >= 65536)
    for (int t = 0; t < rows; ++t) {
      const float* g = gate_up + static_cast<size_t>(t) * 2 * local;
      kernels::SiluMul(g, g + local, act + static_cast<size_t>(t) * width_ + inter_.begin, local);
    }
  }
  PD_RETURN_IF_ERROR(pass.linear.GatherColumns(act, rows, width_, inter_));
  return pass.linear.ColumnParallelLinear(act, rows, down_, hidden_, pass.hidden, out);
}

namespace {

// The workspace buffers of a DenseMlp pass (SwiGlu takes kScratch and the one after).
enum Buffer : int { kNormed, kOutput, kScratch };

}  // namespace

DenseMlp::DenseMlp(const ModelConfig& config, const TpSlices& tp, LayerWeights& w,
                   MatrixPacker& packer)
    : config_(config),
      post_norm_(w.post_norm),
      mlp_(w.gate_proj, w.up_proj, w.down_proj, config.intermediate_size, tp.intermediate,
           tp.hidden, packer) {}

Status DenseMlp::Run(ForwardPass& pass) {
  const int total = pass.rows;
  const int hidden = config_.hidden_size;
  Workspace& ws = pass.workspace;
  float* h = ws.Floats(kNormed, static_cast<size_t>(total) * hidden);
  kernels::RmsNorm(pass.x, post_norm_.as<float>(), h, total, hidden,
                   static_cast<float>(config_.rms_norm_eps));
  float* out = ws.Floats(kOutput, static_cast<size_t>(total) * hidden);
  PD_RETURN_IF_ERROR(mlp_.Apply(pass, h, total, out, kScratch));
  pass.AddToResidual(out);
  return Status::Ok();
}

}  // namespace pdserve
