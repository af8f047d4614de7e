// The one byte codec for what pdserve sends to another process: fixed-width unsigned integers
// in little-endian order, written and read byte by byte (never a memcpy of an integer or a
// struct, so the bytes depend on neither the host's byte order nor its padding), and byte
// strings behind a u32 length. ByteReader never reads past its input and never trusts a
// length: counts are capped by the caller and checked against the bytes left before anything
// is allocated; a short or out-of-range input is a ProtocolError naming the field.
// Used by the fabric's descriptors and message header, the messenger's protocol and the
// tensor-parallel step message (engine/rank_workers.h).
// Thread-compatible value types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "common/status.h"

namespace pdserve {

class ByteWriter {
 public:
  void U8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void U16(uint16_t v) { Little(v, 2); }
  void U32(uint32_t v) { Little(v, 4); }
  void U64(uint64_t v) { Little(v, 8); }
  void Raw(std::string_view bytes) { out_.append(bytes); }
  // Each value as a U32 of its two's complement bits, one after the other, no count (write the
  // count first, or let the reader know it otherwise).
  void I32s(std::span<const int32_t> values);
  // u32 length, then the bytes. Precondition: at most 4 GiB - 1 bytes.
  void Bytes(std::string_view bytes);
  // Overwrites 4 bytes at `offset` (a length known only after the body is written).
  // Precondition: offset + 4 <= size().
  void PatchU32(size_t offset, uint32_t v);

  size_t size() const { return out_.size(); }
  std::string Take() { return std::move(out_); }

 private:
  void Little(uint64_t v, int bytes);
  std::string out_;
};

// Each read names the field it reads, so a truncated input says where it ended. After a failed
// read the reader's position is unspecified: give up on the input.
class ByteReader {
 public:
  explicit ByteReader(std::string_view in) : in_(in) {}

  Status U8(const char* field, uint8_t* v);
  Status U16(const char* field, uint16_t* v);
  Status U32(const char* field, uint32_t* v);
  Status U64(const char* field, uint64_t* v);
  // A u32 that must lie in [0, INT32_MAX] (token ids, page ids, sizes).
  Status NonNegativeI32(const char* field, int32_t* v);
  // values.size() of them, one after the other (as ByteWriter::I32s writes them): refused whole,
  // before anything is read, if the bytes left cannot hold them all.
  Status NonNegativeI32s(const char* field, std::span<int32_t> values);
  Status Raw(const char* field, size_t n, std::string_view* bytes);
  // A length-prefixed string of at most `max` bytes.
  Status Bytes(const char* field, size_t max, std::string* bytes);
  // A u32 element count of at most `max`, each element at least `min_element_bytes` long:
  // refused if the bytes left cannot hold that many (so a lying count allocates nothing).
  Status Count(const char* field, uint32_t max, size_t min_element_bytes, uint32_t* count);

  size_t remaining() const { return in_.size(); }
  bool AtEnd() const { return in_.empty(); }
  size_t position() const { return position_; }

 private:
  Status Little(const char* field, int bytes, uint64_t* v);
  Status Truncated(const char* field, size_t need) const;

  std::string_view in_;
  size_t position_ = 0;
};

}  // namespace pdserve
