#include "testing/raw_http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <strings.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace pdserve::testing {

RawHttpClient::RawHttpClient(int port) {
  fd_ = socket(AF_INET, SOCK_STREAM, 0);
  if (fd_ < 0) return;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd_);
    fd_ = -1;
  }
}

RawHttpClient::~RawHttpClient() {
  if (fd_ >= 0) close(fd_);
}

bool RawHttpClient::Send(std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

std::string RawHttpClient::ReadAtLeast(size_t n, Deadline deadline) {
  std::string out;
  bool closed = false;
  while (out.size() < n && !closed && !deadline.Passed()) {
    out += Read(deadline, n - out.size(), &closed);
  }
  return out;
}

std::string RawHttpClient::ReadUntilClose(Deadline deadline, bool* closed) {
  std::string out;
  *closed = false;
  while (!*closed && !deadline.Passed()) out += Read(deadline, size_t{1} << 20, closed);
  return out;
}

std::vector<RawResponse> RawHttpClient::ReadResponses(size_t count, Deadline deadline,
                                                      bool* closed) {
  std::vector<RawResponse> out;
  *closed = false;
  for (;;) {
    size_t consumed = 0;
    for (RawResponse& r : ParseResponses(unparsed_, &consumed, count - out.size())) {
      out.push_back(std::move(r));
    }
    unparsed_.erase(0, consumed);
    if (out.size() >= count || *closed || deadline.Passed()) return out;
    unparsed_ += Read(deadline, size_t{1} << 20, closed);
  }
}

std::string RawHttpClient::Read(Deadline deadline, size_t max, bool* closed) {
  std::string out;
  char buf[65536];
  while (!deadline.Passed()) {
    pollfd p{fd_, POLLIN, 0};
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline.at() - Clock::now());
    if (poll(&p, 1, static_cast<int>(std::max<int64_t>(1, left.count()))) <= 0) continue;
    const ssize_t n = recv(fd_, buf, std::min(sizeof(buf), max), 0);
    if (n <= 0) {  // orderly close, or a reset after the answer
      *closed = true;
      break;
    }
    out.append(buf, static_cast<size_t>(n));
    break;
  }
  return out;
}

namespace {

// The value of header `name` in `head` (case-insensitive name), or "".
std::string HeaderValue(std::string_view head, std::string_view name) {
  for (size_t at = head.find("\r\n"); at != std::string_view::npos;) {
    const size_t start = at + 2;
    const size_t end = head.find("\r\n", start);
    const std::string_view line =
        head.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start);
    if (line.size() > name.size() && line[name.size()] == ':' &&
        strncasecmp(line.data(), name.data(), name.size()) == 0) {
      std::string_view value = line.substr(name.size() + 1);
      while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
      return std::string(value);
    }
    at = end;
  }
  return "";
}

// De-chunks the body at the start of `bytes`; the bytes it took, or 0 if not whole yet.
size_t Dechunk(std::string_view bytes, std::string* body) {
  size_t at = 0;
  for (;;) {
    const size_t line_end = bytes.find("\r\n", at);
    if (line_end == std::string_view::npos) return 0;
    const size_t size =
        std::strtoul(std::string(bytes.substr(at, line_end - at)).c_str(), nullptr, 16);
    at = line_end + 2;
    if (size == 0) return bytes.substr(at).starts_with("\r\n") ? at + 2 : 0;
    if (bytes.size() < at + size + 2) return 0;
    body->append(bytes.substr(at, size));
    at += size + 2;
  }
}

}  // namespace

int StatusOf(std::string_view answer) {
  return answer.starts_with("HTTP/1.1 ") && answer.size() >= 12
             ? std::stoi(std::string(answer.substr(9, 3)))
             : 0;
}

std::vector<RawResponse> ParseResponses(std::string_view bytes, size_t* consumed,
                                        size_t max_count) {
  std::vector<RawResponse> out;
  size_t at = 0;
  while (at < bytes.size() && out.size() < max_count) {
    const size_t head_end = bytes.find("\r\n\r\n", at);
    if (head_end == std::string_view::npos) break;
    RawResponse r;
    r.head = std::string(bytes.substr(at, head_end - at));
    r.status = r.head.starts_with("HTTP/1.") && r.head.size() >= 12
                   ? std::atoi(r.head.substr(9, 3).c_str())
                   : 0;
    size_t next = head_end + 4;
    if (r.status >= 100 && r.status < 200) {
      at = next;  // an interim answer (100 Continue)
      continue;
    }
    const std::string length = HeaderValue(r.head, "Content-Length");
    if (!length.empty()) {
      const size_t n = std::strtoul(length.c_str(), nullptr, 10);
      if (bytes.size() < next + n) break;
      r.body = std::string(bytes.substr(next, n));
      next += n;
    } else if (strcasecmp(HeaderValue(r.head, "Transfer-Encoding").c_str(), "chunked") == 0) {
      const size_t taken = Dechunk(bytes.substr(next), &r.body);
      if (taken == 0) break;
      next += taken;
    }
    out.push_back(std::move(r));
    at = next;
  }
  if (consumed != nullptr) *consumed = at;
  return out;
}

std::string ChunkedBody(std::string_view data) {
  char head[32];
  std::snprintf(head, sizeof(head), "%zx\r\n", data.size());
  return data.empty() ? "0\r\n\r\n" : head + std::string(data) + "\r\n0\r\n\r\n";
}

SmuggleProbe ProbeSmuggling(int port, const std::string& refused, const std::string& follow_up) {
  SmuggleProbe probe;
  RawHttpClient raw(port);
  if (!raw.ok() || !raw.Send(refused)) return probe;
  auto read = [&](Duration wait) {
    for (RawResponse& r : raw.ReadResponses(1, Deadline::After(wait), &probe.closed)) {
      probe.responses.push_back(std::move(r));
    }
  };
  read(std::chrono::seconds(20));
  if (probe.closed || probe.responses.empty()) return probe;
  // A server that took the body for a request may answer it unasked; if it answers later, its
  // answer comes before the follow-up's, which shows it as well.
  read(std::chrono::milliseconds(300));
  if (probe.closed || !raw.Send(follow_up)) return probe;
  read(std::chrono::seconds(20));
  if (!probe.closed) read(std::chrono::milliseconds(300));  // anything more, or the close
  return probe;
}

namespace {

std::string SmugglingProblem(const SmuggleProbe& probe, const EarlyAnswer& c,
                             std::string_view smuggled_marker, std::string_view follow_up_marker) {
  const std::vector<RawResponse>& r = probe.responses;
  if (r.empty()) return "no answer at all";
  if (c.status != 0 && r[0].status != c.status) {
    return "first answer " + std::to_string(r[0].status) + ", expected " +
           std::to_string(c.status) + ": " + r[0].head + "\n" + r[0].body;
  }
  for (size_t i = 0; i < r.size(); ++i) {
    if (r[i].body.find(smuggled_marker) != std::string::npos) {
      return "answer " + std::to_string(i) + " answers the smuggled request: " + r[i].body;
    }
  }
  if (r.size() == 1) {
    if (!probe.closed) return "the follow-up got no answer and the connection stayed open";
    if (!r[0].closes()) return "closed without saying Connection: close: " + r[0].head;
    return "";
  }
  if (c.must_close) return "the connection stayed open: " + r[1].head;
  if (r[1].body.find(follow_up_marker) == std::string::npos) {
    return "the second answer is not the follow-up's: " + r[1].head + "\n" + r[1].body;
  }
  if (r.size() > 2) return "more answers than requests: " + r[2].head + "\n" + r[2].body;
  return "";
}

}  // namespace

std::string WithLength(const std::string& head, std::string_view body) {
  return head + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + std::string(body);
}

std::string WithChunks(const std::string& head, std::string_view body) {
  return head + "Transfer-Encoding: chunked\r\n\r\n" + ChunkedBody(body);
}

std::vector<std::string> SmugglingProblems(int port, const std::vector<EarlyAnswer>& cases,
                                           const std::string& follow_up,
                                           std::string_view smuggled_marker,
                                           std::string_view follow_up_marker) {
  std::vector<std::string> problems;
  for (const EarlyAnswer& c : cases) {
    const std::string problem = SmugglingProblem(ProbeSmuggling(port, c.request, follow_up), c,
                                                 smuggled_marker, follow_up_marker);
    if (!problem.empty()) problems.push_back(c.name + ": " + problem);
  }
  return problems;
}

std::string PrintableText(std::string_view bytes) {
  std::string out;
  for (const char c : bytes) {
    if (c == '\r') {
      out += "\\r";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c >= 0x20 && c < 0x7f) {
      out += c;
    } else {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02x", static_cast<unsigned char>(c));
      out += hex;
    }
  }
  return out;
}

std::string ChunkedPostHead(const std::string& path) {
  return "POST " + path +
         " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
         "Transfer-Encoding: chunked\r\n\r\n";
}

std::string Chunk(size_t size) {
  char head[32];
  std::snprintf(head, sizeof(head), "%zx\r\n", size);
  return head + std::string(size, 'x') + "\r\n";
}

std::vector<EarlyAnswer> CommonEarlyAnswers(const std::string& auth, const std::string& smuggled) {
  const std::string post =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n";
  return {
      {"wrong key", WithLength(post + "Authorization: Bearer wrong\r\n", smuggled), 401},
      {"missing key", WithLength(post, smuggled), 401},
      {"wrong key, chunked body", WithChunks(post + "Authorization: Bearer no\r\n", smuggled), 401},
      {"missing key, Expect: 100-continue", WithLength(post + "Expect: 100-continue\r\n", smuggled),
       401},
      {"unknown POST route", WithLength("POST /nowhere HTTP/1.1\r\nHost: x\r\n" + auth, smuggled),
       404},
      {"form post",
       WithLength("POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + auth +
                      "Content-Type: multipart/form-data; boundary=b\r\n",
                  smuggled),
       415},
      {"declared length over the limit",
       post + auth + "Content-Length: 100000000\r\n\r\n" + smuggled, 413, true},
      {"malformed chunk", post + auth + "Transfer-Encoding: chunked\r\n\r\nzz\r\n" + smuggled, 400,
       true},
      {"Transfer-Encoding other than chunked",
       post + auth + "Transfer-Encoding: identity\r\n\r\n" + smuggled, 400, true},
      {"Content-Length and Transfer-Encoding",
       post + auth + "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n" +
           ChunkedBody(smuggled),
       400, true},
  };
}

}  // namespace pdserve::testing
