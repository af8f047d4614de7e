// TpGroup: the ranks of one tensor-parallel model replica, as the forward pass sees them
// (DESIGN.md §1 "rank workers"). A rank computes a slice of each product's output columns and
// the group gathers the slices, so every output element is reduced in the same order as with
// one rank: tensor parallelism never changes a bit (DESIGN.md §6). Implementations:
// engine/shm_tp_group.h (ranks in separate processes, or threads, over shared memory).
#pragma once

#include "common/status.h"

namespace pdserve {

class TpGroup {
 public:
  virtual ~TpGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // `data` is a row-major [rows][width] float matrix of which this rank has computed columns
  // [col_begin, col_end); the ranks' ranges are disjoint and together cover [0, width). Returns
  // when `data` holds every rank's columns on every rank. All ranks make the same sequence of
  // calls with the same rows and width. Errors: a rank failed or died, or one did not arrive
  // within the group's deadline; the group is then failed and every later call fails at once.
  virtual Status AllGatherColumns(float* data, int rows, int width, int col_begin, int col_end) = 0;
};

}  // namespace pdserve
