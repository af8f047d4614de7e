// Where an HTTP/1.1 request ends, decided by pdserve before httplib parses it. A proxy in front
// of a node or router and the server must agree on where each request ends, or one client's
// bytes become part of another's request (request smuggling, CWE-444). httplib 0.11 is lenient
// where RFC 9112 asks a server to refuse (bare LF, whitespace before a colon, a coding other
// than chunked, Content-Length and Transfer-Encoding together, "0x5" as a chunk size), so a
// request is checked here first, strictly, and its extent is what http::Server holds httplib
// to; anything this code would have to guess at is refused with 400 and the connection closed.
//
// HeadScanner checks bytes as they arrive (so garbage is refused at once, not at the header
// deadline); ParseFraming reads a whole head's framing; ChunkedBodyScanner finds the end of a
// chunked body and decodes it. Plain values and pure functions; thread-compatible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace pdserve::http {

enum class ScanState { kIncomplete, kComplete, kMalformed };

// Checks the bytes of a request head as they arrive: a request line (method token, SP, the
// rest without control bytes), header lines ("token:" then a value without control bytes but
// HTAB; no folded lines), every line ending in CRLF, and the blank line that ends the head.
class HeadScanner {
 public:
  // Scans `head` from where the previous call stopped. Precondition: `head` starts where the
  // head starts and holds at least what the previous call saw.
  ScanState Scan(std::string_view head);
  bool started() const { return pos_ > 0; }
  // kComplete: bytes of the head, its blank line included.
  size_t head_size() const { return head_size_; }
  // kMalformed: what is wrong, for the log and the 400 message.
  const char* problem() const { return problem_; }

 private:
  enum class Part { kMethod, kRequestLine, kLineStart, kName, kValue };
  ScanState Fail(const char* problem);

  size_t pos_ = 0;
  size_t method_size_ = 0;
  Part part_ = Part::kMethod;
  bool after_cr_ = false;
  ScanState state_ = ScanState::kIncomplete;
  size_t head_size_ = 0;
  const char* problem_ = "";
};

// How a request's body is framed (RFC 9112 6.3).
struct RequestFraming {
  enum class Body { kNone, kLength, kChunked };
  size_t head_size = 0;
  Body body = Body::kNone;
  uint64_t length = 0;           // kLength: the declared length (UINT64_MAX if it overflows)
  bool expect_continue = false;  // "Expect: 100-continue" from an HTTP/1.1 client
};

// The framing of `head`, a whole head that HeadScanner found well-formed. InvalidArgument,
// naming the fault, for a request line that is not METHOD SP TARGET SP HTTP/1.x, a
// Content-Length that is not digits alone or appears twice, a Transfer-Encoding other than
// one "chunked" (or one from an HTTP/1.0 client), or both framings at once.
Result<RequestFraming> ParseFraming(std::string_view head);

// Finds the end of a chunked body as it arrives and decodes it: chunk sizes in hex digits
// only, extensions allowed (and ignored), each chunk's data followed by CRLF, and no trailer
// fields (httplib reads none either).
class ChunkedBodyScanner {
 public:
  enum class State { kIncomplete, kComplete, kMalformed, kTooLarge };
  // Bodies whose data passes `max_bytes`, or whose encoding passes twice that (tiny chunks),
  // are kTooLarge.
  explicit ChunkedBodyScanner(uint64_t max_bytes) : max_bytes_(max_bytes) {}
  // Scans `more`, the bytes of the encoded body that follow those of the previous calls,
  // appending chunk data to *body. Stops at the body's end (kComplete) or at a fault; otherwise
  // takes all of `more`.
  State Scan(std::string_view more, std::string* body);
  // Bytes of the encoded body taken so far (kComplete: all of it, its last CRLF included).
  uint64_t encoded_size() const { return pos_; }
  const char* problem() const { return problem_; }

 private:
  enum class Part { kSize, kExtension, kSizeLf, kData, kDataCr, kDataLf, kEndCr, kEndLf };
  State Fail(const char* problem);

  const uint64_t max_bytes_;
  uint64_t pos_ = 0;
  Part part_ = Part::kSize;
  int size_digits_ = 0;
  uint64_t chunk_left_ = 0;  // kSize: the size so far; kData: data bytes still to come
  uint64_t data_bytes_ = 0;
  size_t line_bytes_ = 0;  // of the current size line (extensions are bounded)
  State state_ = State::kIncomplete;
  const char* problem_ = "";
};

}  // namespace pdserve::http
