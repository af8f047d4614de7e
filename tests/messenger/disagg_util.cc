#include "disagg_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "http/cluster_auth.h"

namespace pdserve::testing {

Completion Complete(int port, const std::vector<int32_t>& prompt, int max_tokens,
                    const httplib::Headers& headers) {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(120, 0);
  const nlohmann::json body = {{"prompt", prompt},
                               {"max_tokens", max_tokens},
                               {"temperature", 0},
                               {"ignore_eos", true},
                               {"return_token_ids", true}};
  const auto start = std::chrono::steady_clock::now();
  auto res = client.Post("/v1/completions", headers, body.dump(), "application/json");
  Completion c;
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!res) return c;
  c.status = res->status;
  c.retry_after = res->get_header_value("Retry-After");
  c.body = nlohmann::json::parse(res->body, nullptr, false);
  if (c.status == 200 && c.body.is_object()) {
    c.token_ids = c.body["choices"][0]["token_ids"].get<std::vector<int32_t>>();
  }
  return c;
}

std::string ErrorMessage(const Completion& c) {
  return c.body.is_object() && c.body.contains("error") ? c.body["error"].dump() : c.body.dump();
}

std::vector<std::string> With(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

std::string PeerName(const NodeProcess& node) { return "127.0.0.1:" + std::to_string(node.port()); }

double NodeMetric(int port, const std::string& name) {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(5, 0);
  auto res = client.Get("/metrics");
  if (!res || res->status != 200) return -1;
  return MetricValue(res->body, name);
}

double WaitForMetric(int port, const std::string& name, double value, int deadline_ms) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(deadline_ms);
  double seen = NodeMetric(port, name);
  while (seen != value && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    seen = NodeMetric(port, name);
  }
  return seen;
}

std::pair<int, std::string> GetText(int port, const std::string& path) {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(5, 0);
  auto res = client.Get(path);
  if (!res) return {0, ""};
  return {res->status, res->body};
}

nlohmann::json GetJson(int port, const std::string& path) {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(5, 0);
  // /internal/ routes answer only to a proof of the cluster secret.
  httplib::Headers headers;
  if (path.starts_with(http::kInternalPathPrefix)) {
    headers = http::ClusterAuthHeaders(kClusterKey, "GET", path);
  }
  auto res = client.Get(path, headers);
  if (!res || res->status != 200) return nlohmann::json::value_t::discarded;
  return nlohmann::json::parse(res->body, nullptr, false);
}

std::vector<int32_t> RandomPrompt(int length, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> token(3, 250);
  std::vector<int32_t> prompt(length);
  for (int32_t& t : prompt) t = token(rng);
  return prompt;
}

bool StreamThenDrop(int port, const std::vector<int32_t>& prompt, int max_tokens, int hold_ms,
                    const std::function<bool()>& drop_when) {
  const nlohmann::json body = {{"prompt", prompt},
                               {"max_tokens", max_tokens},
                               {"temperature", 0},
                               {"ignore_eos", true},
                               {"stream", true}};
  const std::string payload = body.dump();
  const std::string request =
      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
      "Content-Type: application/json\r\nContent-Length: " +
      std::to_string(payload.size()) + "\r\n\r\n" + payload;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool sent = connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
  for (size_t off = 0; sent && off < request.size();) {
    const ssize_t n = send(fd, request.data() + off, request.size() - off, MSG_NOSIGNAL);
    if (n <= 0) sent = false;
    off += n > 0 ? static_cast<size_t>(n) : 0;
  }
  const Deadline hold = Deadline::AfterMs(hold_ms);
  if (sent && drop_when) {
    while (!hold.Passed() && !drop_when()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  } else if (sent && hold_ms > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms));
  }
  close(fd);
  return sent;
}

void ExpectNodeDrained(int port, int deadline_ms) {
  EXPECT_EQ(WaitForMetric(port, "pdserve:messenger_requests_in_flight", 0, deadline_ms), 0)
      << "messenger requests still in flight on port " << port;
  EXPECT_EQ(WaitForMetric(port, "pdserve:kv_cache_usage_perc", 0, deadline_ms), 0)
      << "KV pages still in use on port " << port;
}

std::vector<std::string> PrefillArgs(const std::string& provider,
                                     const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"--role", "prefill",       "--fabric-provider",
                                   provider, "--cluster-key", kClusterKey};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

std::vector<std::string> DecodeArgs(const std::string& provider,
                                    const std::vector<int>& prefill_ports,
                                    const std::vector<std::string>& extra) {
  // Every prompt goes to the prefill node, however short (these tests are about the transfer).
  std::vector<std::string> args = {
      "--role",        "decode",    "--fabric-provider",          provider,
      "--cluster-key", kClusterKey, "--local-prefill-max-tokens", "0"};
  for (int port : prefill_ports) {
    args.push_back("--prefill-peer");
    args.push_back("127.0.0.1:" + std::to_string(port));
  }
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

}  // namespace pdserve::testing
