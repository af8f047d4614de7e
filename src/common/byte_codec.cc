#include "common/byte_codec.h"

#include <limits>

#include <fmt/format.h>

#include "common/check.h"

namespace pdserve {

void ByteWriter::Little(uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void ByteWriter::I32s(std::span<const int32_t> values) {
  out_.reserve(out_.size() + 4 * values.size());
  for (int32_t v : values) Little(static_cast<uint32_t>(v), 4);
}

void ByteWriter::Bytes(std::string_view bytes) {
  PD_CHECK(bytes.size() <= std::numeric_limits<uint32_t>::max());
  U32(static_cast<uint32_t>(bytes.size()));
  out_.append(bytes);
}

void ByteWriter::PatchU32(size_t offset, uint32_t v) {
  PD_CHECK(offset + 4 <= out_.size());
  for (int i = 0; i < 4; ++i) out_[offset + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

Status ByteReader::Truncated(const char* field, size_t need) const {
  return Status::ProtocolError(fmt::format("message truncated at {} (byte {}: needs {}, {} left)",
                                           field, position_, need, in_.size()));
}

Status ByteReader::Little(const char* field, int bytes, uint64_t* v) {
  if (in_.size() < static_cast<size_t>(bytes)) return Truncated(field, bytes);
  uint64_t x = 0;
  for (int i = 0; i < bytes; ++i) x |= uint64_t{static_cast<uint8_t>(in_[i])} << (8 * i);
  in_.remove_prefix(bytes);
  position_ += bytes;
  *v = x;
  return Status::Ok();
}

Status ByteReader::U8(const char* field, uint8_t* v) {
  uint64_t x = 0;
  PD_RETURN_IF_ERROR(Little(field, 1, &x));
  *v = static_cast<uint8_t>(x);
  return Status::Ok();
}

Status ByteReader::U16(const char* field, uint16_t* v) {
  uint64_t x = 0;
  PD_RETURN_IF_ERROR(Little(field, 2, &x));
  *v = static_cast<uint16_t>(x);
  return Status::Ok();
}

Status ByteReader::U32(const char* field, uint32_t* v) {
  uint64_t x = 0;
  PD_RETURN_IF_ERROR(Little(field, 4, &x));
  *v = static_cast<uint32_t>(x);
  return Status::Ok();
}

Status ByteReader::U64(const char* field, uint64_t* v) { return Little(field, 8, v); }

Status ByteReader::NonNegativeI32(const char* field, int32_t* v) {
  uint32_t x = 0;
  PD_RETURN_IF_ERROR(U32(field, &x));
  if (x > static_cast<uint32_t>(std::numeric_limits<int32_t>::max())) {
    return Status::ProtocolError(fmt::format("{} is {} (negative or too large)", field, x));
  }
  *v = static_cast<int32_t>(x);
  return Status::Ok();
}

Status ByteReader::NonNegativeI32s(const char* field, std::span<int32_t> values) {
  if (in_.size() / 4 < values.size()) return Truncated(field, 4 * values.size());
  for (int32_t& v : values) PD_RETURN_IF_ERROR(NonNegativeI32(field, &v));
  return Status::Ok();
}

Status ByteReader::Raw(const char* field, size_t n, std::string_view* bytes) {
  if (in_.size() < n) return Truncated(field, n);
  *bytes = in_.substr(0, n);
  in_.remove_prefix(n);
  position_ += n;
  return Status::Ok();
}

Status ByteReader::Bytes(const char* field, size_t max, std::string* bytes) {
  uint32_t n = 0;
  PD_RETURN_IF_ERROR(U32(field, &n));
  if (n > max) {
    return Status::ProtocolError(fmt::format("{} is {} bytes (at most {})", field, n, max));
  }
  std::string_view view;
  PD_RETURN_IF_ERROR(Raw(field, n, &view));
  bytes->assign(view);
  return Status::Ok();
}

Status ByteReader::Count(const char* field, uint32_t max, size_t min_element_bytes,
                         uint32_t* count) {
  uint32_t n = 0;
  PD_RETURN_IF_ERROR(U32(field, &n));
  if (n > max) return Status::ProtocolError(fmt::format("{} is {} (at most {})", field, n, max));
  if (static_cast<uint64_t>(n) * min_element_bytes > in_.size()) {
    return Status::ProtocolError(
        fmt::format("{} is {} but only {} bytes are left (message truncated or count corrupt)",
                    field, n, in_.size()));
  }
  *count = n;
  return Status::Ok();
}

}  // namespace pdserve
