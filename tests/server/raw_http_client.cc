#include "server/raw_http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

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

}  // namespace pdserve::testing
