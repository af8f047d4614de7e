// libFuzzer target for request parsing (server/openai_request.h): every input must give a
// request or an ApiError — never a crash, a hang, an exception or a sanitizer report. Built by
// `make fuzz` with clang++ -fsanitize=fuzzer,address,undefined (not part of the CMake build).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "server/openai_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  pdserve::server::ParseLimits limits;
  limits.vocab_size = 512;
  auto completion = pdserve::server::ParseCompletionRequest(body, limits);
  if (!completion.ok()) (void)completion.error().ToJson();
  auto chat = pdserve::server::ParseChatRequest(body, limits);
  if (!chat.ok()) (void)chat.error().ToJson();
  (void)pdserve::server::ParseTokenizeRequest(body, limits);
  (void)pdserve::server::ParseDetokenizeRequest(body, limits);
  return 0;
}
