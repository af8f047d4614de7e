#include "disagg_util.h"

#include <chrono>
#include <thread>

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
  auto res = client.Post("/v1/completions", headers, body.dump(), "application/json");
  Completion c;
  if (!res) return c;
  c.status = res->status;
  c.body = nlohmann::json::parse(res->body, nullptr, false);
  if (c.status == 200 && c.body.is_object()) {
    c.token_ids = c.body["choices"][0]["token_ids"].get<std::vector<int32_t>>();
  }
  return c;
}

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
  std::vector<std::string> args = {"--role", "decode",        "--fabric-provider",
                                   provider, "--cluster-key", kClusterKey};
  for (int port : prefill_ports) {
    args.push_back("--prefill-peer");
    args.push_back("127.0.0.1:" + std::to_string(port));
  }
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

}  // namespace pdserve::testing
