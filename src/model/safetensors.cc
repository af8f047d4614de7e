#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

namespace pdserve {
namespace {

using json = nlohmann::json;

// The reference implementation refuses headers above 100 MB; real ones are well under 1 MB.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
// Bounds that keep numel * element size within int64 for any accepted shape.
constexpr int64_t kMaxDimSize = int64_t{1} << 40;
constexpr int64_t kMaxNumel = int64_t{1} << 50;

// Owns a file descriptor.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::optional<DType> ParseDType(const std::string& name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  if (name == "F8_E4M3") return DType::kF8E4M3;
  if (name == "I8") return DType::kI8;
  return std::nullopt;
}

// Reads a little-endian u64 regardless of the host byte order.
uint64_t ReadLe64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void WriteLe64(uint64_t v, char* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

Result<int64_t> ParseNonNegative(const json& v, const std::string& what) {
  if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0)) {
    return Status::DataLoss(what + " must be a non-negative integer, got " + v.dump());
  }
  uint64_t u = v.get<uint64_t>();
  if (u > static_cast<uint64_t>(kMaxNumel)) return Status::DataLoss(what + " is too large");
  return static_cast<int64_t>(u);
}

}  // namespace

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// One mmapped .safetensors file and the tensors its header describes.
class SafetensorsFile {
 public:
  static Result<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile() {
    if (base_ != nullptr) ::munmap(const_cast<uint8_t*>(base_), size_);
  }
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorView>& tensors() const { return tensors_; }

 private:
  SafetensorsFile(std::string path, const uint8_t* base, size_t size)
      : path_(std::move(path)), base_(base), size_(size) {}
  Status ParseHeader();
  Status ParseEntry(const std::string& name, const json& entry, uint64_t data_start);
  Status CheckOverlaps() const;

  std::string path_;
  const uint8_t* base_;
  size_t size_;
  std::vector<TensorView> tensors_;
};

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    int err = errno;
    if (err == ENOENT) return Status::NotFound("cannot open " + path + ": no such file");
    return Status::FromErrno("cannot open " + path, err);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno("cannot stat " + path, errno);
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    return Status::DataLoss(path + ": file is " + std::to_string(size) +
                            " bytes, too short for a safetensors header (truncated?)");
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  if (map == MAP_FAILED) return Status::FromErrno("cannot mmap " + path, errno);
  // Loading reads every byte once, front to back.
  ::madvise(map, size, MADV_SEQUENTIAL);
  std::unique_ptr<SafetensorsFile> file(
      new SafetensorsFile(path, static_cast<const uint8_t*>(map), size));
  PD_RETURN_IF_ERROR(file->ParseHeader());
  return file;
}

Status SafetensorsFile::ParseHeader() {
  const uint64_t header_len = ReadLe64(base_);
  if (header_len == 0 || header_len > kMaxHeaderBytes) {
    return Status::DataLoss(path_ + ": implausible header length " + std::to_string(header_len) +
                            " (not a safetensors file?)");
  }
  if (header_len > size_ - 8) {
    return Status::DataLoss(path_ + ": header length " + std::to_string(header_len) +
                            " runs past the end of the file (" + std::to_string(size_) +
                            " bytes): truncated?");
  }
  json header;
  try {
    const char* text = reinterpret_cast<const char*>(base_ + 8);
    header = json::parse(text, text + header_len);
  } catch (const json::exception& e) {
    return Status::DataLoss(path_ + ": header is not valid JSON: " + e.what());
  }
  if (!header.is_object()) return Status::DataLoss(path_ + ": header is not a JSON object");
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    PD_RETURN_IF_ERROR(ParseEntry(it.key(), it.value(), 8 + header_len));
  }
  return CheckOverlaps();
}

Status SafetensorsFile::ParseEntry(const std::string& name, const json& entry,
                                   uint64_t data_start) {
  const std::string what = path_ + ": tensor '" + name + "'";
  if (!entry.is_object()) return Status::DataLoss(what + " is not a JSON object");
  auto dt = entry.find("dtype");
  auto sh = entry.find("shape");
  auto off = entry.find("data_offsets");
  if (dt == entry.end() || !dt->is_string() || sh == entry.end() || !sh->is_array() ||
      off == entry.end() || !off->is_array() || off->size() != 2) {
    return Status::DataLoss(what +
                            " needs 'dtype' (string), 'shape' (list) and 'data_offsets' "
                            "([begin, end])");
  }
  std::optional<DType> dtype = ParseDType(dt->get<std::string>());
  if (!dtype) {
    return Status::InvalidArgument(what + " has dtype " + dt->get<std::string>() +
                                   "; supported: F32, F16, BF16, F8_E4M3, I8");
  }
  TensorView view;
  view.name = name;
  view.file = path_;
  view.dtype = *dtype;
  int64_t numel = 1;
  for (const json& d : *sh) {
    PD_ASSIGN_OR_RETURN(int64_t dim, ParseNonNegative(d, what + " shape entry"));
    if (dim > kMaxDimSize || (dim > 0 && numel > kMaxNumel / dim)) {
      return Status::DataLoss(what + " has an implausibly large shape");
    }
    numel *= dim;
    view.shape.push_back(dim);
  }
  PD_ASSIGN_OR_RETURN(int64_t begin, ParseNonNegative((*off)[0], what + " data_offsets[0]"));
  PD_ASSIGN_OR_RETURN(int64_t end, ParseNonNegative((*off)[1], what + " data_offsets[1]"));
  const uint64_t data_size = size_ - data_start;
  const uint64_t expected = static_cast<uint64_t>(numel) * DTypeSize(*dtype);
  if (end < begin || static_cast<uint64_t>(end - begin) != expected) {
    return Status::DataLoss(what + " has data_offsets [" + std::to_string(begin) + ", " +
                            std::to_string(end) + "] but dtype and shape " +
                            ShapeString(view.shape) + " need " + std::to_string(expected) +
                            " bytes");
  }
  if (static_cast<uint64_t>(end) > data_size) {
    return Status::DataLoss(what + " ends at data offset " + std::to_string(end) +
                            " past the end of the data (" + std::to_string(data_size) +
                            " bytes): file truncated?");
  }
  if ((data_start + static_cast<uint64_t>(begin)) % DTypeSize(*dtype) != 0) {
    return Status::DataLoss(what + " is misaligned for its dtype");
  }
  view.data = base_ + data_start + begin;
  view.nbytes = static_cast<size_t>(expected);
  tensors_.push_back(std::move(view));
  return Status::Ok();
}

Status SafetensorsFile::CheckOverlaps() const {
  std::vector<const TensorView*> order;
  for (const TensorView& t : tensors_) {
    if (t.nbytes > 0) order.push_back(&t);
  }
  std::sort(order.begin(), order.end(),
            [](const TensorView* a, const TensorView* b) { return a->data < b->data; });
  for (size_t i = 1; i < order.size(); ++i) {
    const auto* prev_end = static_cast<const uint8_t*>(order[i - 1]->data) + order[i - 1]->nbytes;
    if (static_cast<const uint8_t*>(order[i]->data) < prev_end) {
      return Status::DataLoss(path_ + ": tensors '" + order[i - 1]->name + "' and '" +
                              order[i]->name + "' overlap");
    }
  }
  return Status::Ok();
}

namespace {

// Shard file names from model.safetensors.index.json (in first-seen order).
Result<std::vector<std::string>> ReadIndex(const std::string& index_path,
                                           std::map<std::string, std::string>* weight_map) {
  std::ifstream in(index_path, std::ios::binary);
  if (!in) return Status::NotFound("cannot open " + index_path);
  std::stringstream ss;
  ss << in.rdbuf();
  json j;
  try {
    j = json::parse(ss.str());
  } catch (const json::exception& e) {
    return Status::DataLoss(index_path + ": invalid JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
    return Status::DataLoss(index_path + ": missing object 'weight_map'");
  }
  std::vector<std::string> files;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string()) {
      return Status::DataLoss(index_path + ": weight_map entry '" + it.key() +
                              "' is not a file name");
    }
    std::string file = it.value().get<std::string>();
    // Shards live beside the index; anything else is a malformed (or hostile) index.
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..") {
      return Status::DataLoss(index_path + ": weight_map entry '" + it.key() +
                              "' names an invalid file '" + file + "'");
    }
    (*weight_map)[it.key()] = file;
    if (std::find(files.begin(), files.end(), file) == files.end()) files.push_back(file);
  }
  return files;
}

Result<std::vector<std::string>> ListSafetensors(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".safetensors") files.push_back(entry.path().filename());
  }
  if (ec) return Status::IoError("cannot list " + dir + ": " + ec.message());
  if (files.empty()) return Status::NotFound("no *.safetensors file in " + dir);
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

SafetensorsSet::~SafetensorsSet() = default;

Result<std::unique_ptr<SafetensorsSet>> SafetensorsSet::Open(const std::string& model_dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(model_dir, ec)) {
    return Status::NotFound("model directory " + model_dir + " does not exist");
  }
  std::unique_ptr<SafetensorsSet> set(new SafetensorsSet());
  set->dir_ = model_dir;
  const std::string index_path = model_dir + "/model.safetensors.index.json";
  std::map<std::string, std::string> weight_map;
  std::vector<std::string> names;
  if (std::filesystem::exists(index_path, ec)) {
    PD_ASSIGN_OR_RETURN(names, ReadIndex(index_path, &weight_map));
  } else {
    PD_ASSIGN_OR_RETURN(names, ListSafetensors(model_dir));
  }
  for (const std::string& name : names) {
    PD_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(model_dir + "/" + name));
    for (const TensorView& t : file->tensors()) {
      auto [it, inserted] = set->tensors_.emplace(t.name, t);
      if (!inserted) {
        return Status::DataLoss("tensor '" + t.name + "' appears in both " + it->second.file +
                                " and " + t.file);
      }
    }
    set->files_.push_back(std::move(file));
  }
  for (const auto& [tensor, file] : weight_map) {
    auto it = set->tensors_.find(tensor);
    if (it == set->tensors_.end() || it->second.file != model_dir + "/" + file) {
      return Status::DataLoss(index_path + " maps tensor '" + tensor + "' to " + file +
                              ", which does not contain it");
    }
  }
  return set;
}

bool SafetensorsSet::Has(const std::string& name) const { return tensors_.count(name) > 0; }

Result<TensorView> SafetensorsSet::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return Status::NotFound("tensor '" + name + "' not found in the safetensors of " + dir_);
  }
  return it->second;
}

Result<TensorView> SafetensorsSet::FindWithShape(const std::string& name,
                                                 const std::vector<int64_t>& shape) const {
  PD_ASSIGN_OR_RETURN(TensorView view, Find(name));
  if (view.shape != shape) {
    return Status::InvalidArgument("tensor '" + name + "' in " + view.file + " has shape " +
                                   ShapeString(view.shape) + ", expected " + ShapeString(shape));
  }
  return view;
}

std::vector<std::string> SafetensorsSet::Names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, view] : tensors_) names.push_back(name);
  return names;
}

namespace {

size_t NumBytes(const TensorToWrite& t) {
  size_t n = DTypeSize(t.dtype);
  for (int64_t d : t.shape) n *= static_cast<size_t>(d);
  return n;
}

// Owns a FILE* opened for writing.
struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

}  // namespace

Status WriteSafetensorsStreamed(const std::string& path, const std::vector<TensorToWrite>& tensors,
                                const TensorFiller& fill) {
  // Widest dtype first (stable): every tensor then starts aligned to its element size.
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return DTypeSize(tensors[a].dtype) > DTypeSize(tensors[b].dtype);
  });
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  size_t offset = 0, max_bytes = 0;
  for (size_t i : order) {
    const TensorToWrite& t = tensors[i];
    for (int64_t d : t.shape) {
      if (d < 0) return Status::InvalidArgument("tensor '" + t.name + "' has a negative dim");
    }
    if (header.contains(t.name)) {
      return Status::InvalidArgument("tensor '" + t.name + "' is written twice");
    }
    const size_t n = NumBytes(t);
    header[t.name] = {{"dtype", std::string(DTypeName(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + n}}};
    offset += n;
    max_bytes = std::max(max_bytes, n);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  char len[8];
  WriteLe64(text.size(), len);

  // Written beside the target and renamed, so a crash never leaves a half file under `path`.
  const std::string tmp = path + ".tmp";
  std::unique_ptr<std::FILE, FileCloser> f(std::fopen(tmp.c_str(), "wb"));
  if (!f) return Status::FromErrno("cannot create " + tmp, errno);
  bool ok = std::fwrite(len, 1, 8, f.get()) == 8 &&
            std::fwrite(text.data(), 1, text.size(), f.get()) == text.size();
  std::vector<char> buffer(ok ? max_bytes : 0);
  for (size_t k = 0; ok && k < order.size(); ++k) {
    const size_t n = NumBytes(tensors[order[k]]);
    Status s = fill(order[k], buffer.data());
    if (!s.ok()) {
      f.reset();
      std::remove(tmp.c_str());
      return s;
    }
    ok = std::fwrite(buffer.data(), 1, n, f.get()) == n;
  }
  const int err = errno;
  if (std::fclose(f.release()) != 0) ok = false;
  if (!ok) {
    std::remove(tmp.c_str());
    return Status::FromErrno("cannot write " + tmp, err);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return Status::FromErrno("cannot rename " + tmp + " to " + path, errno);
  }
  return Status::Ok();
}

Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors) {
  return WriteSafetensorsStreamed(path, tensors, [&](size_t i, void* out) {
    const size_t n = NumBytes(tensors[i]);
    if (n > 0) std::memcpy(out, tensors[i].data, n);
    return Status::Ok();
  });
}

}  // namespace pdserve
