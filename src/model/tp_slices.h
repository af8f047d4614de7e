// TpSlices: which share of a model one tensor-parallel rank holds (DESIGN.md §1): its query and
// KV heads and its output columns of each product. Plain value types; thread-compatible.
#pragma once

#include "common/status.h"
#include "model/config.h"

namespace pdserve {

// [begin, end) of a dimension: a rank's heads or output columns.
struct DimRange {
  int begin = 0;
  int end = 0;
  int size() const { return end - begin; }
};

// One rank's share of a model under tensor parallelism (the whole model when size is 1).
struct TpSlices {
  int rank = 0;
  int size = 1;
  DimRange q_heads, kv_heads;  // attention heads of this rank
  DimRange hidden;             // output columns of o_proj and down_proj
  DimRange intermediate;       // output columns of gate_proj and up_proj
  // Output columns of every expert's gate_proj and up_proj (MoE layers): each rank holds its
  // share of every expert, so the ranks' work does not depend on which experts are chosen.
  DimRange expert_intermediate;
  DimRange shared_intermediate;  // output columns of the shared experts' gate_proj and up_proj
  DimRange vocab;                // output columns of the lm_head
  // Errors: rank outside [0, size), a query-head group that the replicas of a KV head cannot
  // split evenly (kv_heads < size).
  static Result<TpSlices> Create(const ModelConfig& config, int rank, int size);
};

}  // namespace pdserve
