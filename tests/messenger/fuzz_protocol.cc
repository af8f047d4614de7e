// libFuzzer target for the messenger's message decoder (messenger/protocol.h): every input
// must decode to a message or a ProtocolError, never a crash, a hang or a sanitizer report;
// and whatever decodes must re-encode to the same bytes (the encoding is canonical), so the
// encoder and decoder cannot drift apart. Built by `make fuzz` with clang++
// -fsanitize=fuzzer,address,undefined (not part of the CMake build).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "messenger/protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto message = pdserve::messenger::DecodeMessage(bytes);
  if (!message.ok()) {
    if (message.status().code() != pdserve::StatusCode::kProtocolError) std::abort();
    return 0;
  }
  auto encoded = pdserve::messenger::EncodeMessage(*message);
  if (!encoded.ok() || *encoded != bytes) std::abort();
  return 0;
}
