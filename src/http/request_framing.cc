#include "http/request_framing.h"

#include <strings.h>

#include <algorithm>
#include <limits>

namespace pdserve::http {
namespace {

// Methods are short words; a longer "method" is garbage, refused before it fills the head.
constexpr size_t kMaxMethodBytes = 20;
// A chunk-size line with its extensions; httplib ignores extensions, so they are only bounded.
constexpr size_t kMaxChunkLineBytes = 4096;

// RFC 9110 5.6.2: the characters of a token (method, header name).
bool IsTokenChar(unsigned char c) {
  if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) != std::string_view::npos;
}

bool IsControl(unsigned char c) { return c < 0x20 || c == 0x7f; }

int HexValue(unsigned char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool SameText(std::string_view a, std::string_view b) {
  return a.size() == b.size() && strncasecmp(a.data(), b.data(), a.size()) == 0;
}

std::string_view TrimWhitespace(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Digits alone (RFC 9110 8.6), UINT64_MAX past its range; false for anything else ("+5",
// "5, 5", " 5x", ""), from which httplib's strtoull would have read some number.
bool ParseLength(std::string_view text, uint64_t* length) {
  if (text.empty()) return false;
  uint64_t n = 0;
  for (const char c : text) {
    if (c < '0' || c > '9') return false;
    const uint64_t digit = static_cast<uint64_t>(c - '0');
    n = n > (std::numeric_limits<uint64_t>::max() - digit) / 10
            ? std::numeric_limits<uint64_t>::max()
            : n * 10 + digit;
  }
  *length = n;
  return true;
}

}  // namespace

ScanState HeadScanner::Fail(const char* problem) {
  problem_ = problem;
  state_ = ScanState::kMalformed;
  return state_;
}

ScanState HeadScanner::Scan(std::string_view head) {
  for (; state_ == ScanState::kIncomplete && pos_ < head.size(); ++pos_) {
    const auto c = static_cast<unsigned char>(head[pos_]);
    if (after_cr_) {
      if (c != '\n') return Fail("a CR not followed by LF");
      after_cr_ = false;
      switch (part_) {
        case Part::kMethod:
          return Fail("a request line without a target");
        case Part::kName:
          return Fail("a header line without a colon");
        case Part::kRequestLine:
        case Part::kValue:
          part_ = Part::kLineStart;
          break;
        case Part::kLineStart:  // the blank line
          head_size_ = pos_ + 1;
          state_ = ScanState::kComplete;
          break;
      }
      continue;
    }
    if (c == '\r') {
      after_cr_ = true;
      continue;
    }
    if (c == '\n') return Fail("a line ending in a bare LF");
    if (IsControl(c) && c != '\t') return Fail("a control byte");
    switch (part_) {
      case Part::kMethod:
        if (c == ' ' && method_size_ > 0) {
          part_ = Part::kRequestLine;
        } else if (!IsTokenChar(c)) {
          return Fail("a method that is not a token");
        } else if (++method_size_ > kMaxMethodBytes) {
          return Fail("a method that is too long");
        }
        break;
      case Part::kRequestLine:
        if (c == '\t') return Fail("a tab in the request line");
        break;
      case Part::kLineStart:
        if (c == ' ' || c == '\t') return Fail("a folded header line");
        if (!IsTokenChar(c)) return Fail("a header name that is not a token");
        part_ = Part::kName;
        break;
      case Part::kName:
        // Whitespace before the colon is not a token character either (RFC 9112 5.1).
        if (c == ':') {
          part_ = Part::kValue;
        } else if (!IsTokenChar(c)) {
          return Fail("a header name that is not a token");
        }
        break;
      case Part::kValue:
        break;
    }
  }
  return state_;
}

Result<RequestFraming> ParseFraming(std::string_view head) {
  RequestFraming framing;
  framing.head_size = head.size();
  size_t line_end = head.find("\r\n");
  const std::string_view request_line = head.substr(0, line_end);
  const size_t sp1 = request_line.find(' ');
  const size_t sp2 = request_line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || sp2 == sp1 + 1 ||
      request_line.find(' ', sp2 + 1) != std::string_view::npos) {
    return Status::InvalidArgument("a request line that is not METHOD TARGET VERSION");
  }
  const std::string_view version = request_line.substr(sp2 + 1);
  if (version != "HTTP/1.1" && version != "HTTP/1.0") {
    return Status::InvalidArgument("an HTTP version other than 1.0 and 1.1");
  }
  const bool http10 = version == "HTTP/1.0";
  int lengths = 0, codings = 0;
  // Header lines up to the blank line; HeadScanner saw to their shape ("name:value").
  for (size_t start = line_end + 2; start < head.size(); start = line_end + 2) {
    line_end = head.find("\r\n", start);
    const std::string_view line = head.substr(start, line_end - start);
    if (line.empty()) break;
    const size_t colon = line.find(':');
    const std::string_view name = line.substr(0, colon);
    const std::string_view value = TrimWhitespace(line.substr(colon + 1));
    if (SameText(name, "Content-Length")) {
      if (++lengths > 1) return Status::InvalidArgument("more than one Content-Length");
      if (!ParseLength(value, &framing.length)) {
        return Status::InvalidArgument("a Content-Length that is not a number");
      }
    } else if (SameText(name, "Transfer-Encoding")) {
      if (++codings > 1) return Status::InvalidArgument("more than one Transfer-Encoding");
      if (!SameText(value, "chunked")) {
        return Status::InvalidArgument("a Transfer-Encoding other than chunked");
      }
    } else if (SameText(name, "Expect") && SameText(value, "100-continue")) {
      framing.expect_continue = !http10;
    }
  }
  if (codings > 0 && lengths > 0) {
    return Status::InvalidArgument("both Content-Length and Transfer-Encoding");
  }
  if (codings > 0 && http10) {
    return Status::InvalidArgument("Transfer-Encoding from an HTTP/1.0 client");
  }
  if (codings > 0) {
    framing.body = RequestFraming::Body::kChunked;
  } else if (lengths > 0 && framing.length > 0) {
    framing.body = RequestFraming::Body::kLength;
  }
  return framing;
}

ChunkedBodyScanner::State ChunkedBodyScanner::Fail(const char* problem) {
  problem_ = problem;
  state_ = State::kMalformed;
  return state_;
}

ChunkedBodyScanner::State ChunkedBodyScanner::Scan(std::string_view more, std::string* body) {
  const uint64_t max_encoded =
      max_bytes_ > std::numeric_limits<uint64_t>::max() / 4 ? max_bytes_ : 2 * max_bytes_ + 4096;
  size_t i = 0;
  // Every case below takes at least one byte, or ends the scan.
  while (state_ == State::kIncomplete && i < more.size()) {
    if (pos_ + i > max_encoded) {
      problem_ = "a chunked encoding too large";
      state_ = State::kTooLarge;
      break;
    }
    const auto c = static_cast<unsigned char>(more[i]);
    switch (part_) {
      case Part::kSize:
        if (const int digit = HexValue(c); digit >= 0) {
          // Sixteen hex digits could overflow; fifteen are 2^60 bytes, past any limit.
          if (++size_digits_ > 15) {
            problem_ = "a chunk too large";
            state_ = State::kTooLarge;
            break;
          }
          chunk_left_ = chunk_left_ * 16 + static_cast<uint64_t>(digit);
        } else if (size_digits_ > 0 && (c == ';' || c == ' ' || c == '\t')) {
          part_ = Part::kExtension;
        } else if (size_digits_ > 0 && c == '\r') {
          part_ = Part::kSizeLf;
        } else {
          Fail("a chunk size that is not hex digits");
          break;
        }
        ++line_bytes_;
        ++i;
        break;
      case Part::kExtension:
        if (c == '\r') {
          part_ = Part::kSizeLf;
        } else if (IsControl(c) && c != '\t') {
          Fail("a control byte in a chunk extension");
          break;
        }
        if (++line_bytes_ > kMaxChunkLineBytes) {
          Fail("a chunk size line too long");
          break;
        }
        ++i;
        break;
      case Part::kSizeLf:
        if (c != '\n') {
          Fail("a chunk size line not ending in CRLF");
          break;
        }
        ++i;
        if (chunk_left_ == 0) {
          part_ = Part::kEndCr;
        } else if (chunk_left_ > max_bytes_ - data_bytes_) {
          problem_ = "a chunked body too large";
          state_ = State::kTooLarge;
        } else {
          data_bytes_ += chunk_left_;
          part_ = Part::kData;
        }
        break;
      case Part::kData: {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk_left_, more.size() - i));
        body->append(more.substr(i, n));
        i += n;
        chunk_left_ -= n;
        if (chunk_left_ == 0) part_ = Part::kDataCr;
        break;
      }
      case Part::kDataCr:
      case Part::kDataLf:
        if (c != (part_ == Part::kDataCr ? '\r' : '\n')) {
          Fail("chunk data not followed by CRLF");
          break;
        }
        ++i;
        if (part_ == Part::kDataCr) {
          part_ = Part::kDataLf;
        } else {
          part_ = Part::kSize;
          size_digits_ = 0;
          line_bytes_ = 0;
        }
        break;
      case Part::kEndCr:
        if (c != '\r') {
          Fail("trailer fields after the last chunk");
          break;
        }
        part_ = Part::kEndLf;
        ++i;
        break;
      case Part::kEndLf:
        if (c != '\n') {
          Fail("the last chunk not followed by CRLF");
          break;
        }
        ++i;
        state_ = State::kComplete;
        break;
    }
  }
  pos_ += i;
  return state_;
}

}  // namespace pdserve::http
