// Read-only access to *.safetensors files by mmap. A SafetensorsSet is one model directory:
// either a single model.safetensors, a sharded set named by model.safetensors.index.json, or
// every *.safetensors in the folder. Immutable after Open: safe to read from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/dtype.h"

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
  // (anything but F32/F16/BF16), overlapping or misaligned data, bad JSON.
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

 private:
  SafetensorsSet() = default;
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, TensorView> tensors_;
};

// Writes tensors to one safetensors file (used by the synthetic model writer and tests).
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;  // numel * DTypeSize(dtype) bytes
};
Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors);

}  // namespace pdserve
