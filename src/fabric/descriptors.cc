#include "fabric/descriptors.h"

#include <fmt/format.h>

#include "common/byte_codec.h"

namespace pdserve::fabric {
namespace {

constexpr uint32_t kDescriptorMagic = 0x4d445046;  // "FPDM"
constexpr uint32_t kAddressMagic = 0x41445046;     // "FPDA"
constexpr uint16_t kFormatVersion = 1;
constexpr size_t kMaxDomains = 64;
constexpr size_t kMaxEndpointBytes = 1024;

Status CheckHeader(ByteReader& r, uint32_t magic, std::string_view what) {
  uint32_t got_magic = 0;
  uint16_t version = 0;
  if (!r.U32("magic", &got_magic).ok() || got_magic != magic) {
    return Status::InvalidArgument(fmt::format("not a serialised {} (bad magic)", what));
  }
  if (!r.U16("version", &version).ok() || version != kFormatVersion) {
    return Status::InvalidArgument(fmt::format(
        "{} format version {} is not supported (expected {})", what, version, kFormatVersion));
  }
  return Status::Ok();
}

}  // namespace

std::string MemoryDescriptor::Serialize() const {
  ByteWriter w;
  w.U32(kDescriptorMagic);
  w.U16(kFormatVersion);
  w.U64(length);
  w.U16(static_cast<uint16_t>(domains.size()));
  for (const RemoteKey& k : domains) {
    w.U64(k.base);
    w.U64(k.key);
  }
  return w.Take();
}

Result<MemoryDescriptor> MemoryDescriptor::Parse(std::string_view bytes) {
  ByteReader r(bytes);
  PD_RETURN_IF_ERROR(CheckHeader(r, kDescriptorMagic, "memory descriptor"));
  MemoryDescriptor d;
  uint16_t n = 0;
  if (!r.U64("length", &d.length).ok() || !r.U16("domains", &n).ok()) {
    return Status::DataLoss("memory descriptor is truncated");
  }
  if (n == 0 || n > kMaxDomains) {
    return Status::InvalidArgument(fmt::format("memory descriptor has {} domains", n));
  }
  d.domains.resize(n);
  for (RemoteKey& k : d.domains) {
    if (!r.U64("base", &k.base).ok() || !r.U64("key", &k.key).ok()) {
      return Status::DataLoss("memory descriptor is truncated");
    }
  }
  if (!r.AtEnd()) return Status::InvalidArgument("memory descriptor has trailing bytes");
  if (d.length == 0) return Status::InvalidArgument("memory descriptor has zero length");
  return d;
}

std::string TransferEngineAddress::Serialize() const {
  ByteWriter w;
  w.U32(kAddressMagic);
  w.U16(kFormatVersion);
  w.U16(static_cast<uint16_t>(provider));
  w.U64(instance);
  w.U16(static_cast<uint16_t>(endpoints.size()));
  for (const std::string& e : endpoints) w.Bytes(e);
  return w.Take();
}

Result<TransferEngineAddress> TransferEngineAddress::Parse(std::string_view bytes) {
  ByteReader r(bytes);
  PD_RETURN_IF_ERROR(CheckHeader(r, kAddressMagic, "engine address"));
  TransferEngineAddress a;
  uint16_t provider = 0;
  uint16_t n = 0;
  if (!r.U16("provider", &provider).ok() || !r.U64("instance", &a.instance).ok() ||
      !r.U16("endpoints", &n).ok()) {
    return Status::DataLoss("engine address is truncated");
  }
  if (provider > static_cast<uint16_t>(Provider::kEfa)) {
    return Status::InvalidArgument(fmt::format("engine address names provider {}", provider));
  }
  a.provider = static_cast<Provider>(provider);
  if (n == 0 || n > kMaxDomains) {
    return Status::InvalidArgument(fmt::format("engine address has {} endpoints", n));
  }
  a.endpoints.resize(n);
  for (std::string& e : a.endpoints) {
    if (!r.Bytes("endpoint", kMaxEndpointBytes, &e).ok() || e.empty()) {
      return Status::DataLoss("engine address has a truncated or empty endpoint name");
    }
  }
  if (!r.AtEnd()) return Status::InvalidArgument("engine address has trailing bytes");
  return a;
}

std::string HexEncode(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

Result<std::string> HexDecode(std::string_view hex) {
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (hex.size() % 2 != 0) return Status::InvalidArgument("hex string has odd length");
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    int hi = nibble(hex[2 * i]);
    int lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      return Status::InvalidArgument(fmt::format("bad hex digit at position {}", 2 * i));
    }
    out[i] = static_cast<char>(hi * 16 + lo);
  }
  return out;
}

}  // namespace pdserve::fabric
