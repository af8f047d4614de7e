// Read-only access to *.safetensors files by mmap. A SafetensorsSet is one model directory:
// either a single model.safetensors, a sharded set named by model.safetensors.index.json, or
// every *.safetensors in the folder. Immutable after Open: safe to read from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace pdserve {

struct TensorView {
  std::string name;
  std::string file;  // the file it lives in (for error messages)
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // points into the mapping; valid while the set lives
  size_t nbytes = 0;
  int64_t numel() const;
};

class SafetensorsFile;

class SafetensorsSet {
 public:
  // Errors name the file: truncated header, offsets past the end, unsupported dtype
  // (anything but F32/F16/BF16/F8_E4M3), overlapping or misaligned data, bad JSON.
  static Result<std::unique_ptr<SafetensorsSet>> Open(const std::string& model_dir);
  ~SafetensorsSet();
  SafetensorsSet(const SafetensorsSet&) = delete;
  SafetensorsSet& operator=(const SafetensorsSet&) = delete;

  bool Has(const std::string& name) const;
  // NotFound naming the tensor and the directory if absent.
  Result<TensorView> Find(const std::string& name) const;
  // Find() plus a shape check; InvalidArgument naming tensor, file, expected and actual shape.
  Result<TensorView> FindWithShape(const std::string& name,
                                   const std::vector<int64_t>& shape) const;
  std::vector<std::string> Names() const;
  const std::string& dir() const { return dir_; }

 private:
  SafetensorsSet() = default;
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, TensorView> tensors_;
};

// Writes tensors to one safetensors file (used by the synthetic model writer and tests).
// Data is laid out widest dtype first so every tensor is aligned to its element size; the
// header is padded with spaces to a multiple of 8 bytes. Names must be unique.
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;  // numel * DTypeSize(dtype) bytes
};
Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors);

// Streaming form for files larger than one wants in memory: `fill(i, out)` writes the bytes of
// tensors[i] (data ignored) into `out` (nbytes of it), called once per tensor in file order.
// A non-ok Status from fill aborts the write and is returned.
using TensorFiller = std::function<Status(size_t index, void* out)>;
Status WriteSafetensorsStreamed(const std::string& path, const std::vector<TensorToWrite>& tensors,
                                const TensorFiller& fill);

}  // namespace pdserve
