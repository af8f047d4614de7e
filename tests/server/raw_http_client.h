// A raw TCP client for tests that must send what no HTTP library sends (chunked bodies over a
// limit, oversized headers, HTTP/1.0) and see the answer byte for byte, including whether the
// server closed the connection. Test-only; one object per thread, except that Send may run on
// one thread while Read runs on another.
#pragma once

#include <string>
#include <string_view>

#include "common/clock.h"

namespace pdserve::testing {

class RawHttpClient {
 public:
  // Connects to 127.0.0.1:port; ok() says whether it worked.
  explicit RawHttpClient(int port);
  ~RawHttpClient();
  RawHttpClient(const RawHttpClient&) = delete;
  RawHttpClient& operator=(const RawHttpClient&) = delete;

  bool ok() const { return fd_ >= 0; }
  // Sends all of `data`; false once the server closed or reset the connection.
  bool Send(std::string_view data);
  // At least `n` bytes (fewer if the server closes or the deadline passes first).
  std::string ReadAtLeast(size_t n, Deadline deadline);
  // Everything received until the server closes the connection (*closed = true) or the
  // deadline passes (*closed = false).
  std::string ReadUntilClose(Deadline deadline, bool* closed);

 private:
  // What one recv returns (at most `max` bytes); sets *closed at the end of the stream.
  std::string Read(Deadline deadline, size_t max, bool* closed);

  int fd_ = -1;
};

// A chunked request head for POST `path` (Transfer-Encoding: chunked, JSON content type).
std::string ChunkedPostHead(const std::string& path);
// One chunk of `size` bytes of 'x' in chunked framing.
std::string Chunk(size_t size);

}  // namespace pdserve::testing
