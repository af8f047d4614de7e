// A raw TCP client for tests that must send what no HTTP library sends (chunked bodies over a
// limit, oversized headers, HTTP/1.0) and see the answer byte for byte, including whether the
// server closed the connection. Test-only; one object per thread, except that Send may run on
// one thread while Read runs on another.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"

namespace pdserve::testing {

// One HTTP response as a raw client reads it.
struct RawResponse {
  int status = 0;
  std::string head;  // status line and header lines
  std::string body;  // de-chunked
  bool closes() const { return head.find("\r\nConnection: close") != std::string::npos; }
};

// The whole final responses at the start of `bytes`, in order, at most `max_count` (1xx interim
// answers skipped; bodies framed by Content-Length or chunked, none without either, so not
// for answers to HEAD); *consumed (if given) gets the bytes they took.
std::vector<RawResponse> ParseResponses(std::string_view bytes, size_t* consumed = nullptr,
                                        size_t max_count = SIZE_MAX);

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
  // Reads until `count` whole responses (ParseResponses) arrived, the server closed the
  // connection (*closed = true) or the deadline passed, and returns the whole ones; bytes of a
  // response not yet whole are kept for the next call.
  std::vector<RawResponse> ReadResponses(size_t count, Deadline deadline, bool* closed);

 private:
  // What one recv returns (at most `max` bytes); sets *closed at the end of the stream.
  std::string Read(Deadline deadline, size_t max, bool* closed);

  int fd_ = -1;
  std::string unparsed_;  // ReadResponses: the start of a response not yet whole
};

// The code of the HTTP/1.1 status line `answer` starts with, or 0 when it starts with none.
int StatusOf(std::string_view answer);

// `bytes` with CR, LF and other bytes outside printable ASCII escaped (\r, \n, \xNN), for
// failure messages.
std::string PrintableText(std::string_view bytes);

// A chunked request head for POST `path` (Transfer-Encoding: chunked, JSON content type).
std::string ChunkedPostHead(const std::string& path);
// One chunk of `size` bytes of 'x' in chunked framing.
std::string Chunk(size_t size);
// `data` as a whole chunked body: one chunk (none if empty) and the last chunk.
std::string ChunkedBody(std::string_view data);

// What became of a request (`refused`) whose body is itself a whole request (`smuggled`), and
// of the request sent after it on the same connection (`follow_up`, sent once `refused` was
// answered): the whole responses read, in order, and whether the server closed the
// connection. Bytes that desynchronise the two sides show up as an answer to `smuggled`.
struct SmuggleProbe {
  std::vector<RawResponse> responses;
  bool closed = false;
};
SmuggleProbe ProbeSmuggling(int port, const std::string& refused, const std::string& follow_up);
// `head` (request line and header lines, each ending in CRLF) with `body` framed by
// Content-Length, or chunked.
std::string WithLength(const std::string& head, std::string_view body);
std::string WithChunks(const std::string& head, std::string_view body);

// A request answered before its body is read, the body being a request to smuggle.
struct EarlyAnswer {
  std::string name;
  std::string request;
  int status = 0;           // of the first answer; 0: any
  bool must_close = false;  // its framing is ambiguous or broken: the server must close
};
// The early answers every OpenAI front (node and router) gives to POST /v1/completions, each
// with `smuggled` as its body: a wrong or missing key (Content-Length, chunked, Expect:
// 100-continue), an unknown route, a form post, and framing that must close the connection
// (a length over the limit, a malformed chunk, another transfer coding, both framings).
// `auth` is the valid "Authorization: ...\r\n" line.
std::vector<EarlyAnswer> CommonEarlyAnswers(const std::string& auth, const std::string& smuggled);
// Probes each case (ProbeSmuggling) with `follow_up` and returns "NAME: what is wrong" for
// each that fails: the first answer must have the case's status; no answer may contain
// `smuggled_marker` (a text only an answer to the smuggled request holds); then either the
// follow-up's answer (holding `follow_up_marker`) and nothing else, or the close of the
// connection announced by "Connection: close" (always so for must_close).
std::vector<std::string> SmugglingProblems(int port, const std::vector<EarlyAnswer>& cases,
                                           const std::string& follow_up,
                                           std::string_view smuggled_marker,
                                           std::string_view follow_up_marker);

}  // namespace pdserve::testing
