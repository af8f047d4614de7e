#include "model/weights.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/check.h"
#include "common/logging.h"
#include "kernels/kernels.h"
#include "model/quantise.h"
#include "model/safetensors.h"

namespace pdserve {

// ---- Tensor ----

namespace {

constexpr size_t kAlignment = 64;              // a cache line; also what AVX-512 loads want
constexpr size_t kHugePage = size_t{2} << 20;  // x86-64 transparent huge page

void* AllocateAligned(size_t nbytes) {
  void* p = nullptr;
  if (nbytes >= kHugePage) {
    // Weight matrices are streamed in full every decode step: 2 MB pages spare the TLB misses
    // of 4 KB ones (and the page faults while loading). A hint; without THP it still works.
    PD_CHECK_MSG(posix_memalign(&p, kHugePage, nbytes) == 0, "out of memory allocating a tensor");
    ::madvise(p, nbytes, MADV_HUGEPAGE);
    return p;
  }
  // aligned_alloc wants a size that is a multiple of the alignment (and never zero here).
  size_t rounded = std::max(kAlignment, (nbytes + kAlignment - 1) / kAlignment * kAlignment);
  p = std::aligned_alloc(kAlignment, rounded);
  PD_CHECK_MSG(p != nullptr, "out of memory allocating a tensor");
  return p;
}

}  // namespace

void Tensor::FreeDeleter::operator()(void* p) const { std::free(p); }

Tensor Tensor::Uninitialized(DType dtype, std::vector<int64_t> shape) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.data_.reset(AllocateAligned(t.nbytes()));
  return t;
}

Tensor::Tensor(DType dtype, std::vector<int64_t> shape)
    : Tensor(Uninitialized(dtype, std::move(shape))) {
  std::memset(data(), 0, nbytes());
}

const Tensor& Tensor::row_scales() const {
  static const Tensor kNone;
  return row_scales_ != nullptr ? *row_scales_ : kNone;
}

void Tensor::set_row_scales(Tensor scales) {
  row_scales_ = scales.empty() ? nullptr : std::make_unique<Tensor>(std::move(scales));
}

namespace {
// The value of an FP8 or INT8 byte, before its scale.
float Widen8(DType dtype, uint8_t byte) {
  return dtype == DType::kF8E4M3 ? F8E4M3ToF32(byte)
                                 : static_cast<float>(static_cast<int8_t>(byte));
}
}  // namespace

Tensor Dequantise8(const Tensor& w, DType to) {
  PD_CHECK(IsBlockScaled(w.dtype()) && w.shape().size() == 2 && !w.row_scales().empty());
  PD_CHECK(to == DType::kF32 || to == DType::kBF16);
  const int64_t rows = w.dim(0), cols = w.dim(1);
  const int64_t k_blocks = w.row_scales().dim(1);
  Tensor out = Tensor::Uninitialized(to, {rows, cols});
  const auto* bytes = w.as<uint8_t>();
  const auto* scales = w.row_scales().as<float>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float v =
          Widen8(w.dtype(), bytes[r * cols + c]) * scales[r * k_blocks + c / kernels::kFp8BlockK];
      if (to == DType::kF32) {
        out.as<float>()[r * cols + c] = v;
      } else {
        out.as<uint16_t>()[r * cols + c] = F32ToBF16(v);
      }
    }
  }
  return out;
}

int64_t Tensor::numel() const {
  if (shape_.empty()) return 0;
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

size_t ModelWeights::MatrixBytes() const {
  // An FP8 matrix's scales are read with it.
  auto bytes = [](const Tensor& t) { return t.nbytes() + t.row_scales().nbytes(); };
  size_t total = bytes(output_matrix());
  for (const LayerWeights& l : layers) {
    for (const Tensor* t :
         {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.q_a_proj, &l.q_b_proj, &l.kv_a_proj,
          &l.kv_b_proj, &l.gate_proj, &l.up_proj, &l.down_proj, &l.router}) {
      total += bytes(*t);
    }
    for (const ExpertWeights* e : {&l.shared}) {
      total += bytes(e->gate_proj) + bytes(e->up_proj) + bytes(e->down_proj);
    }
    for (const ExpertWeights& e : l.experts) {
      total += bytes(e.gate_proj) + bytes(e.up_proj) + bytes(e.down_proj);
    }
  }
  return total;
}

// ---- Conversion ----

namespace {

// The block scales of an FP8 or INT8 matrix being dequantised: F32 [ceil(rows / block_rows)]
// [ceil(cols / block_cols)] as the checkpoint's weight_scale_inv (weight_scale) holds them.
struct BlockScales {
  std::vector<float> scale;
  int64_t cols = 0;  // of the matrix
  int block_rows = 0, block_cols = 0;
  float At(size_t element) const {
    const int64_t r = static_cast<int64_t>(element) / cols,
                  c = static_cast<int64_t>(element) % cols;
    const int64_t per_row = (cols + block_cols - 1) / block_cols;
    return scale[(r / block_rows) * per_row + c / block_cols];
  }
};

// One tensor to convert from the mapping into its destination: the same dtype copied, another
// converted; an FP8 or INT8 one with `dequantise` scales becomes its value * scale in F32
// (rounded to BF16 for a BF16 destination). With `quantise`, the destination is FP8 or INT8
// (with row scales allocated): the source's values in F32 (dequantised first if 8-bit) are
// quantised by model/quantise.h, 128 rows at a time.
struct ConvertJob {
  TensorView src;
  Tensor* dst;
  std::optional<BlockScales> dequantise;
  bool quantise = false;
};

// Elements [begin, end) of a job's source in F32 (dequantised when it has scales).
void SourceAsF32(const ConvertJob& job, size_t begin, size_t end, float* out) {
  if (!job.dequantise.has_value()) {
    ConvertToF32(job.src.dtype,
                 static_cast<const uint8_t*>(job.src.data) + begin * DTypeSize(job.src.dtype), out,
                 end - begin);
    return;
  }
  const auto* src = static_cast<const uint8_t*>(job.src.data);
  for (size_t e = begin; e < end; ++e) {
    out[e - begin] = Widen8(job.src.dtype, src[e]) * job.dequantise->At(e);
  }
}

// Dequantises FP8 or INT8 elements [begin, end) of a job into F32 or BF16.
void DequantiseRange(const ConvertJob& job, size_t begin, size_t end) {
  const auto* src = static_cast<const uint8_t*>(job.src.data);
  for (size_t e = begin; e < end; ++e) {
    const float v = Widen8(job.src.dtype, src[e]) * job.dequantise->At(e);
    if (job.dst->dtype() == DType::kF32) {
      job.dst->as<float>()[e] = v;
    } else {
      job.dst->as<uint16_t>()[e] = F32ToBF16(v);
    }
  }
}

// Quantises whole rows [begin, end) (elements; a multiple of kQuantBlock rows from the first)
// of a job into its FP8 or INT8 destination and the destination's row scales.
void QuantiseRange(const ConvertJob& job, size_t begin, size_t end) {
  const int64_t cols = job.src.shape[1];
  const int64_t r0 = static_cast<int64_t>(begin) / cols,
                rows = static_cast<int64_t>(end - begin) / cols;
  std::vector<float> values(end - begin);
  SourceAsF32(job, begin, end, values.data());
  Tensor& dst = *job.dst;
  const int64_t k_blocks = (cols + kQuantBlock - 1) / kQuantBlock;
  float* row_scales = dst.mutable_row_scales()->as<float>() + r0 * k_blocks;
  if (dst.dtype() == DType::kI8) {
    QuantiseInt8Rows(values.data(), rows, cols, dst.as<int8_t>() + begin, row_scales);
    return;
  }
  std::vector<float> block_scales(static_cast<size_t>(k_blocks));  // one block row
  QuantiseFp8Rows(values.data(), rows, cols, dst.as<uint8_t>() + begin, block_scales.data());
  for (int64_t r = 0; r < rows; ++r) {
    std::copy(block_scales.begin(), block_scales.end(), row_scales + r * k_blocks);
  }
}

// The first element in [begin, end) of FP8 bytes that is a NaN (0x7f, 0xff), or `end`.
size_t FirstFp8NaN(const uint8_t* bytes, size_t begin, size_t end) {
  for (size_t e = begin; e < end; ++e) {
    if ((bytes[e] & 0x7f) == 0x7f) return e;
  }
  return end;
}

// Converts elements [begin, end) of one job. BF16 from F16 goes through a small F32 buffer.
// Returns the first FP8 NaN of a job that keeps FP8 (the kernels cannot read one), or `end`.
size_t ConvertRange(const ConvertJob& job, size_t begin, size_t end) {
  if (job.quantise) {
    QuantiseRange(job, begin, end);
    return end;
  }
  if (job.dequantise.has_value()) {
    DequantiseRange(job, begin, end);
    return end;
  }
  const DType from = job.src.dtype, to = job.dst->dtype();
  const size_t in_size = DTypeSize(from), out_size = DTypeSize(to);
  const auto* src = static_cast<const uint8_t*>(job.src.data) + begin * in_size;
  auto* dst = static_cast<uint8_t*>(job.dst->data()) + begin * out_size;
  const size_t n = end - begin;
  if (from == to) {
    std::memcpy(dst, src, n * in_size);
    if (from == DType::kF8E4M3) {
      return FirstFp8NaN(static_cast<const uint8_t*>(job.src.data), begin, end);
    }
  } else if (to == DType::kF32) {
    ConvertToF32(from, src, reinterpret_cast<float*>(dst), n);
  } else if (from == DType::kF32) {
    ConvertFromF32(to, reinterpret_cast<const float*>(src), dst, n);
  } else {
    constexpr size_t kBlock = 2048;
    float tmp[kBlock];
    for (size_t i = 0; i < n; i += kBlock) {
      const size_t m = std::min(kBlock, n - i);
      ConvertToF32(from, src + i * in_size, tmp, m);
      ConvertFromF32(to, tmp, dst + i * out_size, m);
    }
  }
  return end;
}

// Runs every job, split into chunks that worker threads pull from a shared counter. The
// first touch of each destination page happens here, spread over the threads. Errors: an FP8
// NaN in a matrix kept FP8 (the first found, naming the tensor).
Status ConvertAll(const std::vector<ConvertJob>& jobs) {
  constexpr size_t kChunk = size_t{1} << 20;  // elements
  struct Chunk {
    const ConvertJob* job;
    size_t begin, end;
  };
  std::vector<Chunk> chunks;
  for (const ConvertJob& job : jobs) {
    const size_t n = static_cast<size_t>(job.src.numel());
    // Quantised in blocks of whole rows (an FP8 block's scale spans 128 rows).
    const size_t chunk =
        job.quantise ? kQuantBlock * static_cast<size_t>(job.src.shape[1]) : kChunk;
    for (size_t b = 0; b < n; b += chunk) chunks.push_back({&job, b, std::min(n, b + chunk)});
  }
  std::atomic<size_t> next{0};
  std::atomic<size_t> nan_chunk{chunks.size()};  // the first chunk holding an FP8 NaN
  std::vector<size_t> nan_at(chunks.size());
  auto worker = [&] {
    for (size_t i = next.fetch_add(1); i < chunks.size(); i = next.fetch_add(1)) {
      nan_at[i] = ConvertRange(*chunks[i].job, chunks[i].begin, chunks[i].end);
      if (nan_at[i] != chunks[i].end) {
        size_t seen = nan_chunk.load();
        while (i < seen && !nan_chunk.compare_exchange_weak(seen, i)) {
        }
      }
    }
  };
  const size_t threads =
      std::min<size_t>({std::max(1u, std::thread::hardware_concurrency()), 16, chunks.size()});
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
  if (const size_t i = nan_chunk.load(); i < chunks.size()) {
    const TensorView& src = chunks[i].job->src;
    return Status::InvalidArgument(fmt::format(
        "tensor '{}' in {} holds an FP8 NaN (0x{:02x}) at element {}: FP8 weights kept in "
        "memory must be numbers (load with --dtype bf16 to dequantise them)",
        src.name, src.file, static_cast<const uint8_t*>(src.data)[nan_at[i]], nan_at[i]));
  }
  return Status::Ok();
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// Looks tensors up with their expected shapes and queues their conversion. A matrix stored as
// F8_E4M3 (config.quantization fp8) comes with its `weight_scale_inv`, one stored as I8
// (quantization int8) with its `weight_scale`: kept 8-bit with row scales when `keep_quantised`,
// else dequantised to the matrix dtype. With `quantise_to` (FP8 or INT8), the linear layers'
// matrices are held in that format: kept if stored so, else quantised at load.
class WeightCollector {
 public:
  WeightCollector(const SafetensorsSet& set, const QuantizationConfig& quantization,
                  DType matrix_dtype, bool keep_quantised, std::optional<DType> quantise_to)
      : set_(set),
        quantization_(quantization),
        matrix_dtype_(matrix_dtype),
        keep_quantised_(keep_quantised),
        quantise_to_(quantise_to) {}

  Status Matrix(const std::string& name, std::vector<int64_t> shape, Tensor* out) {
    if (quantise_to_.has_value() && IsQuantisedLinearName(name)) {
      return AddQuantised(name, std::move(shape), *quantise_to_, out);
    }
    return Add(name, std::move(shape), matrix_dtype_, keep_quantised_, out);
  }
  // The token embedding: a matrix read row by row (never 8-bit in memory).
  Status Embedding(const std::string& name, std::vector<int64_t> shape, Tensor* out) {
    return Add(name, std::move(shape), matrix_dtype_, false, out);
  }
  Status Vector(const std::string& name, int64_t size, Tensor* out) {
    return Add(name, {size}, DType::kF32, false, out);
  }
  // A matrix held in F32 whatever the model's matrix dtype (the MoE router: its choices must
  // not hang on the rounding of the activations, see MoeMlp).
  Status F32Matrix(const std::string& name, std::vector<int64_t> shape, Tensor* out) {
    return Add(name, std::move(shape), DType::kF32, false, out);
  }
  // The output matrix `name` held in INT8, quantised at load from the checkpoint's values
  // whatever it stores (LoadWeights' head_format). `copy`: the tensor is also loaded as another
  // (the tied embedding), so it is not counted twice among the tensors used.
  Status Int8Head(const std::string& name, std::vector<int64_t> shape, bool copy, Tensor* out) {
    PD_ASSIGN_OR_RETURN(TensorView view, set_.FindWithShape(name, shape));
    const size_t before = count();
    PD_RETURN_IF_ERROR(QueueQuantise(std::move(view), DType::kI8, out));
    if (copy) copies_ += count() - before;
    return Status::Ok();
  }

  const std::vector<ConvertJob>& jobs() const { return jobs_; }
  // Tensors of the checkpoint used: converted ones and 8-bit scales (each once).
  size_t count() const { return jobs_.size() + scales_used_ - copies_; }
  // Whether any matrix is held in 8 bits, and in which dtype.
  std::optional<DType> held_8bit() const { return held_8bit_; }

 private:
  Status Add(const std::string& name, std::vector<int64_t> shape, DType dtype, bool keep,
             Tensor* out) {
    PD_ASSIGN_OR_RETURN(TensorView view, set_.FindWithShape(name, shape));
    if (IsBlockScaled(view.dtype)) return AddBlockScaled(std::move(view), dtype, keep, out);
    *out = Tensor::Uninitialized(dtype, std::move(shape));
    jobs_.push_back({std::move(view), out, std::nullopt});
    return Status::Ok();
  }

  // A linear layer's matrix held in `format` (FP8 or INT8) whatever the checkpoint stores.
  Status AddQuantised(const std::string& name, std::vector<int64_t> shape, DType format,
                      Tensor* out) {
    PD_ASSIGN_OR_RETURN(TensorView view, set_.FindWithShape(name, shape));
    if (view.dtype == format && quantization_.block_cols % kernels::kFp8BlockK == 0) {
      return AddBlockScaled(std::move(view), format, true, out);
    }
    PD_RETURN_IF_ERROR(QueueQuantise(std::move(view), format, out));
    held_8bit_ = format;
    return Status::Ok();
  }

  // Queues the quantisation of `view` (dequantised first when it is 8-bit) into *out in
  // `format`, with its row scales.
  Status QueueQuantise(TensorView view, DType format, Tensor* out) {
    std::optional<BlockScales> scales;
    if (IsBlockScaled(view.dtype)) {
      PD_RETURN_IF_ERROR(CheckBlockScaled(view));
      PD_ASSIGN_OR_RETURN(scales, ReadScales(view));
    }
    const int64_t k_blocks = (view.shape[1] + kQuantBlock - 1) / kQuantBlock;
    *out = Tensor::Uninitialized(format, view.shape);
    out->set_row_scales(Tensor::Uninitialized(DType::kF32, {view.shape[0], k_blocks}));
    jobs_.push_back({std::move(view), out, std::move(scales), /*quantise=*/true});
    return Status::Ok();
  }

  // An FP8 or INT8 tensor's dtype against the config's quantization, and its shape.
  Status CheckBlockScaled(const TensorView& view) const {
    const bool fp8 = view.dtype == DType::kF8E4M3;
    if (fp8 ? !quantization_.fp8() : !quantization_.int8()) {
      return Status::InvalidArgument(fmt::format(
          "tensor '{}' in {} is {}, but config.json has no quantization_config (quant_method "
          "\"{}\" with weight_block_size) to say how it is scaled",
          view.name, view.file, DTypeName(view.dtype), fp8 ? "fp8" : "int8"));
    }
    if (view.shape.size() != 2) {
      return Status::InvalidArgument(
          fmt::format("tensor '{}' in {} is {} with shape {}: only weight matrices may be 8-bit",
                      view.name, view.file, DTypeName(view.dtype), ShapeText(view.shape)));
    }
    return Status::Ok();
  }

  Status AddBlockScaled(TensorView view, DType dtype, bool keep, Tensor* out) {
    PD_RETURN_IF_ERROR(CheckBlockScaled(view));
    PD_ASSIGN_OR_RETURN(BlockScales scales, ReadScales(view));
    if (!keep) {
      *out = Tensor::Uninitialized(dtype, view.shape);
      jobs_.push_back({std::move(view), out, std::move(scales)});
      return Status::Ok();
    }
    if (quantization_.block_cols % kernels::kFp8BlockK != 0) {
      return Status::InvalidArgument(fmt::format(
          "quantization_config.weight_block_size [{}, {}]: {} matrices stay {} in memory only "
          "with column blocks of a multiple of {} (load with --dtype bf16 to dequantise them)",
          quantization_.block_rows, quantization_.block_cols, DTypeName(view.dtype),
          DTypeName(view.dtype), kernels::kFp8BlockK));
    }
    // Each row's scale of each 128-wide column block: its block's.
    const int64_t rows = view.shape[0], cols = view.shape[1];
    const int64_t k_blocks = (cols + kernels::kFp8BlockK - 1) / kernels::kFp8BlockK;
    Tensor row_scales = Tensor::Uninitialized(DType::kF32, {rows, k_blocks});
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < k_blocks; ++j) {
        row_scales.as<float>()[r * k_blocks + j] =
            scales.At(static_cast<size_t>(r * cols + j * kernels::kFp8BlockK));
      }
    }
    held_8bit_ = view.dtype;
    *out = Tensor::Uninitialized(view.dtype, view.shape);
    out->set_row_scales(std::move(row_scales));
    jobs_.push_back({std::move(view), out, std::nullopt});
    return Status::Ok();
  }

  // `weight`'s scales (FP8: weight_scale_inv, INT8: weight_scale) as F32, checked against the
  // config's blocks.
  Result<BlockScales> ReadScales(const TensorView& weight) {
    const std::string name =
        weight.name + (weight.dtype == DType::kF8E4M3 ? "_scale_inv" : "_scale");
    Result<TensorView> found = set_.Find(name);
    if (!found.ok()) {
      return Status::NotFound(fmt::format(
          "{} tensor '{}' in {} has no scale tensor '{}' (quantization_config {} needs one "
          "per quantised matrix)",
          DTypeName(weight.dtype), weight.name, weight.file, name,
          weight.dtype == DType::kF8E4M3 ? "fp8" : "int8"));
    }
    const TensorView& view = *found;
    const int bo = quantization_.block_rows, bi = quantization_.block_cols;
    const std::vector<int64_t> want = {(weight.shape[0] + bo - 1) / bo,
                                       (weight.shape[1] + bi - 1) / bi};
    if (view.shape != want) {
      return Status::InvalidArgument(fmt::format(
          "scale tensor '{}' in {} has shape {}, but weight '{}' of shape {} in blocks of {} x {} "
          "(quantization_config.weight_block_size) needs {}",
          name, view.file, ShapeText(view.shape), weight.name, ShapeText(weight.shape), bo, bi,
          ShapeText(want)));
    }
    if (IsBlockScaled(view.dtype)) {
      return Status::InvalidArgument(
          fmt::format("scale tensor '{}' in {} is {}; scales must be F32, BF16 or F16", name,
                      view.file, DTypeName(view.dtype)));
    }
    BlockScales scales{.scale = std::vector<float>(static_cast<size_t>(view.numel())),
                       .cols = weight.shape[1],
                       .block_rows = bo,
                       .block_cols = bi};
    ConvertToF32(view.dtype, view.data, scales.scale.data(), scales.scale.size());
    ++scales_used_;
    return scales;
  }

  const SafetensorsSet& set_;
  const QuantizationConfig& quantization_;
  DType matrix_dtype_;
  bool keep_quantised_;
  std::optional<DType> quantise_to_;
  std::optional<DType> held_8bit_;
  std::vector<ConvertJob> jobs_;
  size_t scales_used_ = 0;
  size_t copies_ = 0;  // jobs and scales of tensors read a second time (Int8Head's copy)
};

// An attention block's tensors: GQA's q/k/v/o (with Qwen2's biases, Qwen3's norms) or MLA's.
Status CollectAttention(const ModelConfig& c, const std::string& p, WeightCollector& w,
                        LayerWeights* l) {
  const int64_t hidden = c.hidden_size;
  if (c.is_mla()) {
    const MlaConfig& a = c.mla;
    const int64_t q_dim = int64_t{c.num_heads} * a.q_head_dim();
    if (a.q_lora_rank > 0) {
      PD_RETURN_IF_ERROR(
          w.Matrix(p + "self_attn.q_a_proj.weight", {a.q_lora_rank, hidden}, &l->q_a_proj));
      PD_RETURN_IF_ERROR(
          w.Vector(p + "self_attn.q_a_layernorm.weight", a.q_lora_rank, &l->q_a_norm));
      PD_RETURN_IF_ERROR(
          w.Matrix(p + "self_attn.q_b_proj.weight", {q_dim, a.q_lora_rank}, &l->q_b_proj));
    } else {
      PD_RETURN_IF_ERROR(w.Matrix(p + "self_attn.q_proj.weight", {q_dim, hidden}, &l->q_proj));
    }
    PD_RETURN_IF_ERROR(w.Matrix(p + "self_attn.kv_a_proj_with_mqa.weight", {a.latent_dim(), hidden},
                                &l->kv_a_proj));
    PD_RETURN_IF_ERROR(
        w.Vector(p + "self_attn.kv_a_layernorm.weight", a.kv_lora_rank, &l->kv_a_norm));
    PD_RETURN_IF_ERROR(
        w.Matrix(p + "self_attn.kv_b_proj.weight",
                 {int64_t{c.num_heads} * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank},
                 &l->kv_b_proj));
    return w.Matrix(p + "self_attn.o_proj.weight", {hidden, int64_t{c.num_heads} * a.v_head_dim},
                    &l->o_proj);
  }
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim,
                kv_dim = int64_t{c.num_kv_heads} * c.head_dim;
  PD_RETURN_IF_ERROR(w.Matrix(p + "self_attn.q_proj.weight", {q_dim, hidden}, &l->q_proj));
  PD_RETURN_IF_ERROR(w.Matrix(p + "self_attn.k_proj.weight", {kv_dim, hidden}, &l->k_proj));
  PD_RETURN_IF_ERROR(w.Matrix(p + "self_attn.v_proj.weight", {kv_dim, hidden}, &l->v_proj));
  if (c.qkv_bias) {
    PD_RETURN_IF_ERROR(w.Vector(p + "self_attn.q_proj.bias", q_dim, &l->q_bias));
    PD_RETURN_IF_ERROR(w.Vector(p + "self_attn.k_proj.bias", kv_dim, &l->k_bias));
    PD_RETURN_IF_ERROR(w.Vector(p + "self_attn.v_proj.bias", kv_dim, &l->v_bias));
  }
  if (c.qk_norm) {
    PD_RETURN_IF_ERROR(w.Vector(p + "self_attn.q_norm.weight", c.head_dim, &l->q_norm));
    PD_RETURN_IF_ERROR(w.Vector(p + "self_attn.k_norm.weight", c.head_dim, &l->k_norm));
  }
  return w.Matrix(p + "self_attn.o_proj.weight", {hidden, q_dim}, &l->o_proj);
}

// One SwiGLU MLP's matrices under `prefix` ("...mlp.", "...mlp.experts.3."), converted into
// the given tensors (which must stay where they are until the conversion).
Status CollectSwiGlu(const std::string& prefix, int64_t hidden, int64_t inter, WeightCollector& w,
                     Tensor* gate, Tensor* up, Tensor* down) {
  PD_RETURN_IF_ERROR(w.Matrix(prefix + "gate_proj.weight", {inter, hidden}, gate));
  PD_RETURN_IF_ERROR(w.Matrix(prefix + "up_proj.weight", {inter, hidden}, up));
  return w.Matrix(prefix + "down_proj.weight", {hidden, inter}, down);
}
Status CollectSwiGlu(const std::string& prefix, int64_t hidden, int64_t inter, WeightCollector& w,
                     ExpertWeights* e) {
  return CollectSwiGlu(prefix, hidden, inter, w, &e->gate_proj, &e->up_proj, &e->down_proj);
}

Status CollectLayer(const ModelConfig& c, int i, WeightCollector& w, LayerWeights* l) {
  const std::string p = "model.layers." + std::to_string(i) + ".";
  const int64_t hidden = c.hidden_size;
  PD_RETURN_IF_ERROR(w.Vector(p + "input_layernorm.weight", hidden, &l->input_norm));
  PD_RETURN_IF_ERROR(CollectAttention(c, p, w, l));
  PD_RETURN_IF_ERROR(w.Vector(p + "post_attention_layernorm.weight", hidden, &l->post_norm));
  if (!c.IsMoeLayer(i)) {
    return CollectSwiGlu(p + "mlp.", hidden, c.intermediate_size, w, &l->gate_proj, &l->up_proj,
                         &l->down_proj);
  }
  const MoeConfig& m = c.moe;
  PD_RETURN_IF_ERROR(w.F32Matrix(p + "mlp.gate.weight", {m.num_experts, hidden}, &l->router));
  if (m.topk_method == MoeConfig::TopK::kNoAuxTc) {
    PD_RETURN_IF_ERROR(
        w.Vector(p + "mlp.gate.e_score_correction_bias", m.num_experts, &l->router_bias));
  }
  l->experts.resize(m.num_experts);
  for (int e = 0; e < m.num_experts; ++e) {
    PD_RETURN_IF_ERROR(CollectSwiGlu(p + "mlp.experts." + std::to_string(e) + ".", hidden,
                                     m.expert_intermediate, w, &l->experts[e]));
  }
  if (m.shared_experts > 0) {
    PD_RETURN_IF_ERROR(CollectSwiGlu(p + "mlp.shared_experts.", hidden,
                                     int64_t{m.expert_intermediate} * m.shared_experts, w,
                                     &l->shared));
  }
  return Status::Ok();
}

// Whether the checkpoint's tensor `copy` holds exactly what `original` holds (dtype, shape and
// bytes; FP8 ones, which come with scales, are never taken as copies). NotFound if `copy` is
// absent.
Result<bool> IsCopyOf(const SafetensorsSet& set, const std::string& copy,
                      const std::string& original) {
  PD_ASSIGN_OR_RETURN(TensorView a, set.Find(copy));
  PD_ASSIGN_OR_RETURN(TensorView b, set.Find(original));
  return a.dtype == b.dtype && a.dtype != DType::kF8E4M3 && a.shape == b.shape &&
         a.nbytes == b.nbytes && std::memcmp(a.data, b.data, a.nbytes) == 0;
}

// MTP module `k` (model.layers.{num_layers + k}.*, ModelWeights::mtp). Its embed_tokens copy, if
// any, is checked and not loaded; *unread counts it and a shared_head.head that only copies the
// output matrix (both used, not converted).
Status CollectMtpModule(const ModelConfig& c, const SafetensorsSet& set, int k, WeightCollector& w,
                        MtpModule* m, size_t* unread) {
  const int index = c.num_layers + k;
  const std::string p = "model.layers." + std::to_string(index) + ".";
  const int64_t hidden = c.hidden_size, vocab = c.vocab_size;
  PD_RETURN_IF_ERROR(w.Vector(p + "enorm.weight", hidden, &m->enorm));
  PD_RETURN_IF_ERROR(w.Vector(p + "hnorm.weight", hidden, &m->hnorm));
  PD_RETURN_IF_ERROR(w.Matrix(p + "eh_proj.weight", {hidden, 2 * hidden}, &m->eh_proj));
  PD_RETURN_IF_ERROR(CollectLayer(c, index, w, &m->layer));
  PD_RETURN_IF_ERROR(w.Vector(p + "shared_head.norm.weight", hidden, &m->head_norm));
  const std::string embed = p + "embed_tokens.weight";
  if (set.Has(embed)) {
    PD_ASSIGN_OR_RETURN(bool copy, IsCopyOf(set, embed, "model.embed_tokens.weight"));
    if (!copy) {
      return Status::InvalidArgument(fmt::format(
          "MTP tensor '{}' differs from model.embed_tokens.weight; the MTP module shares the "
          "model's embedding (as DeepSeek-V3's does), so it must be absent or an exact copy",
          embed));
    }
    ++*unread;
  }
  const std::string head = p + "shared_head.head.weight";
  const std::string output = c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
  if (!set.Has(head)) return Status::Ok();  // the model's output matrix serves
  PD_RETURN_IF_ERROR(set.FindWithShape(head, {vocab, hidden}).status());
  PD_ASSIGN_OR_RETURN(bool copy, IsCopyOf(set, head, output));
  if (copy) {
    ++*unread;
    return Status::Ok();
  }
  return w.Matrix(head, {vocab, hidden}, &m->head);
}

Result<DType> ChooseMatrixDType(const SafetensorsSet& set, std::optional<DType> wanted) {
  if (wanted.has_value()) {
    if (*wanted == DType::kF32 || *wanted == DType::kBF16) return *wanted;
    return Status::InvalidArgument(
        fmt::format("weight matrices cannot be held in {} (f32 or bf16; the matrices of an FP8 "
                    "checkpoint stay FP8 unless one of those is asked for)",
                    DTypeFlagName(*wanted)));
  }
  // The checkpoint's own precision decides: F32 models (e.g. stories260K) stay exact.
  PD_ASSIGN_OR_RETURN(TensorView embed, set.Find("model.embed_tokens.weight"));
  return embed.dtype == DType::kF32 ? DType::kF32 : DType::kBF16;
}

}  // namespace

Result<ModelWeights> LoadWeights(const ModelConfig& config, const std::string& model_dir,
                                 std::optional<DType> matrix_dtype,
                                 std::optional<DType> linear_format,
                                 std::optional<DType> head_format) {
  PD_RETURN_IF_ERROR(config.Validate());
  if (head_format.has_value() && *head_format != DType::kBF16 && *head_format != DType::kI8) {
    return Status::InvalidArgument(
        fmt::format("the lm_head cannot be held as {} (auto, bf16: as the other matrices, or "
                    "int8)",
                    DTypeFlagName(*head_format)));
  }
  if (linear_format.has_value() && !IsBlockScaled(*linear_format) &&
      *linear_format != DType::kBF16) {
    return Status::InvalidArgument(fmt::format("weights cannot be held as {} (bf16, fp8 or int8)",
                                               DTypeFlagName(*linear_format)));
  }
  if (linear_format == DType::kBF16) {
    if (matrix_dtype.has_value() && *matrix_dtype != DType::kBF16) {
      return Status::InvalidArgument(
          fmt::format("--weights bf16 holds every matrix in bf16, which --dtype {} contradicts",
                      DTypeFlagName(*matrix_dtype)));
    }
    matrix_dtype = DType::kBF16;
    linear_format.reset();
  }
  std::optional<DType> quantise_to = linear_format;
  if (quantise_to.has_value() && !matrix_dtype.has_value()) {
    matrix_dtype = DType::kBF16;  // the rest as an 8-bit checkpoint keeps it
  }
  PD_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsSet> set, SafetensorsSet::Open(model_dir));
  ModelWeights w;
  PD_ASSIGN_OR_RETURN(w.matrix_dtype, ChooseMatrixDType(*set, matrix_dtype));
  WeightCollector collect(*set, config.quantization, w.matrix_dtype,
                          /*keep_quantised=*/!matrix_dtype.has_value(), quantise_to);
  const int64_t vocab = config.vocab_size, hidden = config.hidden_size;
  PD_RETURN_IF_ERROR(collect.Embedding("model.embed_tokens.weight", {vocab, hidden}, &w.embed));
  w.layers.resize(config.num_layers);
  for (int i = 0; i < config.num_layers; ++i) {
    PD_RETURN_IF_ERROR(CollectLayer(config, i, collect, &w.layers[i]));
  }
  w.mtp.resize(config.num_nextn_predict_layers);
  size_t mtp_unread = 0;
  for (int k = 0; k < config.num_nextn_predict_layers; ++k) {
    Status s = CollectMtpModule(config, *set, k, collect, &w.mtp[k], &mtp_unread);
    if (s.code() == StatusCode::kNotFound) {
      return Status::NotFound(fmt::format(
          "{} (config.json's num_nextn_predict_layers {} asks for that many MTP modules after "
          "the {} decoder layers)",
          s.message(), config.num_nextn_predict_layers, config.num_layers));
    }
    PD_RETURN_IF_ERROR(s);
  }
  PD_RETURN_IF_ERROR(collect.Vector("model.norm.weight", hidden, &w.final_norm));
  // Auto: an 8-bit head wherever the linear layers are 8-bit (known now: the head comes last).
  const bool int8_head =
      head_format.has_value() ? *head_format == DType::kI8 : collect.held_8bit().has_value();
  if (int8_head) {
    const std::string output =
        config.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    Status s = collect.Int8Head(output, {vocab, hidden}, config.tie_word_embeddings, &w.lm_head);
    if (s.code() == StatusCode::kNotFound && !config.tie_word_embeddings) {
      return Status::NotFound(s.message() +
                              " (tie_word_embeddings is false, so lm_head is needed)");
    }
    PD_RETURN_IF_ERROR(s);
  } else if (!config.tie_word_embeddings) {
    Status s = collect.Matrix("lm_head.weight", {vocab, hidden}, &w.lm_head);
    if (s.code() == StatusCode::kNotFound) {
      return Status::NotFound(s.message() +
                              " (tie_word_embeddings is false, so lm_head is needed)");
    }
    PD_RETURN_IF_ERROR(s);
  }
  // A tied checkpoint may still carry lm_head.weight; it is not read, so not counted as used.
  const size_t unused = set->Names().size() - collect.count() - mtp_unread -
                        (config.tie_word_embeddings && set->Has("lm_head.weight") ? 1 : 0);
  if (unused > 0) {
    PD_LOG_WARN("{}: {} tensors in the checkpoint are not used by {}", model_dir, unused,
                config.architecture_name);
  }
  PD_RETURN_IF_ERROR(ConvertAll(collect.jobs()));
  w.linear_dtype = collect.held_8bit().value_or(w.matrix_dtype);
  w.head_dtype = w.output_matrix().dtype();
  return w;
}

}  // namespace pdserve
