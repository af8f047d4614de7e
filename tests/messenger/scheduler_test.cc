// An external scheduler's part against a running 2P2D cluster (docs/api.md, "External
// schedulers"): it scrapes every node's /metrics under the names the Gateway API inference
// extension's endpoint picker (EPP) reads (vLLM's), picks the decode and the prefill endpoint
// as the EPP's queue and KV-cache scorers would, and sends the request to the chosen decode
// node with the header llm-d's P/D scheduler sets for its routing sidecar
// (x-prefiller-host-port). The chosen prefill node, and only it, must have prefilled it (its KV
// writes), and the tokens must be a colocated node's. Real `pdserve serve` processes over tcp.
#include <memory>
#include <regex>
#include <thread>

#include <gtest/gtest.h>
#include <httplib.h>

#include "disagg_util.h"
#include "model/config.h"

namespace pdserve::testing {
namespace {

const std::vector<std::string> kSchedFlags = {
    "--page-size", std::to_string(kPage), "--kv-dtype", "bf16", "--max-batch-tokens",
    "16",          "--threads",           "1"};

// What the EPP reads from one endpoint (its model server protocol, in vLLM's names).
struct EndpointMetrics {
  int port = 0;
  double waiting = -1;   // vllm:num_requests_waiting
  double running = -1;   // vllm:num_requests_running
  double kv_usage = -1;  // vllm:kv_cache_usage_perc
  int block_size = -1;   // vllm:cache_config_info{block_size}
  int num_blocks = -1;   // vllm:cache_config_info{num_gpu_blocks}
};

// Scrapes a node as the EPP does; a missing name or a type other than gauge fails the test.
EndpointMetrics Scrape(int port) {
  EndpointMetrics m;
  m.port = port;
  const auto [status, text] = GetText(port, "/metrics");
  EXPECT_EQ(status, 200) << "port " << port;
  const std::pair<const char*, double*> gauges[] = {{"vllm:num_requests_waiting", &m.waiting},
                                                    {"vllm:num_requests_running", &m.running},
                                                    {"vllm:kv_cache_usage_perc", &m.kv_usage}};
  for (const auto& [name, value] : gauges) {
    EXPECT_NE(text.find(std::string("# TYPE ") + name + " gauge\n"), std::string::npos)
        << name << " on port " << port;
    *value = MetricValue(text, name);
    EXPECT_GE(*value, 0) << name << " on port " << port;
  }
  std::smatch info;
  static const std::regex kInfo(
      R"re(\nvllm:cache_config_info\{block_size="(\d+)",num_gpu_blocks="(\d+)"\} 1\n)re");
  EXPECT_TRUE(std::regex_search(text, info, kInfo)) << text;
  if (!info.empty()) {
    m.block_size = std::stoi(info[1].str());
    m.num_blocks = std::stoi(info[2].str());
  }
  return m;
}

// The candidate an EPP configured with its queue scorer and its KV-cache utilization scorer
// (weight 1 each) picks: queue score (max - waiting) / (max - min) over the candidates (1 for
// all when they are equal), KV score 1 - usage; the highest sum wins, the first on a tie.
size_t Pick(const std::vector<EndpointMetrics>& candidates) {
  double lo = candidates[0].waiting, hi = candidates[0].waiting;
  for (const EndpointMetrics& c : candidates) {
    lo = std::min(lo, c.waiting);
    hi = std::max(hi, c.waiting);
  }
  size_t best = 0;
  double best_score = -1;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const double queue = hi > lo ? (hi - candidates[i].waiting) / (hi - lo) : 1.0;
    const double score = queue + (1.0 - candidates[i].kv_usage);
    if (score > best_score) {
      best = i;
      best_score = score;
    }
  }
  return best;
}

struct Cluster {
  std::vector<std::unique_ptr<NodeProcess>> prefill, decode;
  std::unique_ptr<NodeProcess> colocated;
};

Cluster StartCluster(int prefill_nodes, int decode_nodes) {
  Cluster c;
  std::vector<int> ports;
  for (int i = 0; i < prefill_nodes; ++i) {
    c.prefill.push_back(
        std::make_unique<NodeProcess>(TinyModelDir(), With(PrefillArgs("tcp"), kSchedFlags)));
    if (!c.prefill.back()->ok()) return c;
    ports.push_back(c.prefill.back()->port());
  }
  for (int i = 0; i < decode_nodes; ++i) {
    c.decode.push_back(
        std::make_unique<NodeProcess>(TinyModelDir(), DecodeArgs("tcp", ports, kSchedFlags)));
    if (!c.decode.back()->ok()) return c;
  }
  c.colocated =
      std::make_unique<NodeProcess>(TinyModelDir(), With(kSchedFlags, {"--no-prefix-caching"}));
  return c;
}

// KV page writes of a prompt's remote prefill: its pages less the last token, every layer (TP 1).
int64_t PrefillWrites(const ModelConfig& config, const std::vector<int32_t>& prompt) {
  return (static_cast<int64_t>(prompt.size()) - 1 + kPage - 1) / kPage * config.num_layers;
}

// A scheduler's request: greedy completion on the decode node it picked, naming the prefill
// node it picked as llm-d's scheduler names it for the routing sidecar (HOST:PORT).
Completion Schedule(const EndpointMetrics& decode, const EndpointMetrics& prefill,
                    const std::vector<int32_t>& prompt, int max_tokens) {
  return Complete(decode.port, prompt, max_tokens,
                  {{"x-prefiller-host-port", "127.0.0.1:" + std::to_string(prefill.port)}});
}

TEST(ExternalSchedulerTest, PicksByVllmMetricsAndPinsThePrefillNodeByLlmdHeader) {
  const Cluster c = StartCluster(2, 2);
  for (const auto& n : c.prefill) ASSERT_TRUE(n->ok()) << n->error();
  for (const auto& n : c.decode) ASSERT_TRUE(n->ok()) << n->error();
  ASSERT_TRUE(c.colocated && c.colocated->ok()) << (c.colocated ? c.colocated->error() : "");
  for (const auto& d : c.decode) {
    ASSERT_EQ(WaitForMetric(d->port(), "pdserve:messenger_peers_ready", 2, 10000), 2);
  }
  Result<ModelConfig> config = ModelConfig::Load(TinyModelDir());
  ASSERT_TRUE(config.ok()) << config.status().ToString();

  // Idle, every node reports the EPP's gauges: nothing queued or running, no page in use, its
  // page size and pool.
  for (const auto* group : {&c.prefill, &c.decode}) {
    for (const auto& n : *group) {
      const EndpointMetrics m = Scrape(n->port());
      EXPECT_EQ(m.waiting, 0);
      EXPECT_EQ(m.running, 0);
      EXPECT_EQ(m.kv_usage, 0);
      EXPECT_EQ(m.block_size, kPage);
      EXPECT_EQ(m.num_blocks, NodeMetric(n->port(), "pdserve:kv_pages_total"));
      EXPECT_GT(m.num_blocks, 0);
    }
  }

  // Load: a long prompt through decode node 0, prefilled by prefill node 0 (named by the
  // header), held until the scheduler's own request is done. While it prefills, P0 holds its
  // pages (KV usage above 0) and D0 counts it as waiting (its KV has not landed).
  const int busy_p = c.prefill[0]->port(), busy_d = c.decode[0]->port();
  int load_status = 0;
  // Joined before the nodes go, even when an assertion below returns early.
  std::jthread load([&] {
    httplib::Client client("127.0.0.1", busy_d);
    client.set_read_timeout(120, 0);
    const nlohmann::json body = {{"prompt", RandomPrompt(kLongPromptTokens, 7)},
                                 {"max_tokens", 2},
                                 {"temperature", 0},
                                 {"ignore_eos", true}};
    auto res = client.Post("/v1/completions",
                           {{"x-prefiller-host-port", "127.0.0.1:" + std::to_string(busy_p)}},
                           body.dump(), "application/json");
    load_status = res ? res->status : 0;
  });
  // Scraped as the EPP scrapes, until the load shows (bounded; the prefill lasts seconds).
  std::vector<EndpointMetrics> decodes, prefills;
  const Deadline loaded = Deadline::AfterMs(20000);
  while (!loaded.Passed()) {
    decodes = {Scrape(busy_d), Scrape(c.decode[1]->port())};
    prefills = {Scrape(busy_p), Scrape(c.prefill[1]->port())};
    if (decodes[0].waiting >= 1 && prefills[0].kv_usage > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(decodes[0].waiting, 1) << "the loaded decode node never reported a waiting request";
  ASSERT_GT(prefills[0].kv_usage, 0) << "the loaded prefill node never reported KV in use";
  EXPECT_EQ(decodes[1].waiting, 0);
  EXPECT_EQ(prefills[1].kv_usage, 0);

  const EndpointMetrics& decode = decodes[Pick(decodes)];
  const EndpointMetrics& prefill = prefills[Pick(prefills)];
  ASSERT_EQ(decode.port, c.decode[1]->port()) << "the picker chose the loaded decode node";
  ASSERT_EQ(prefill.port, c.prefill[1]->port()) << "the picker chose the loaded prefill node";

  const std::vector<int32_t> prompt = RandomPrompt(37, 11);
  const Completion got = Schedule(decode, prefill, prompt, 6);
  const Completion reference = Complete(c.colocated->port(), prompt, 6);
  ASSERT_EQ(got.status, 200) << ErrorMessage(got);
  ASSERT_EQ(reference.status, 200) << ErrorMessage(reference);
  EXPECT_EQ(got.token_ids, reference.token_ids);

  // The picked prefill node computed it: every page of the prompt less its last token left it
  // for the picked decode node; the loaded pair's counters do not include it.
  const int64_t writes = PrefillWrites(*config, prompt);
  EXPECT_EQ(WaitForMetric(prefill.port, "pdserve:messenger_kv_writes_sent_total",
                          static_cast<double>(writes), 5000),
            writes);
  EXPECT_EQ(NodeMetric(decode.port, "pdserve:messenger_kv_writes_received_total"), writes);
  EXPECT_EQ(NodeMetric(decode.port, "pdserve:decode_remote_prefills_total"), 1);
  EXPECT_EQ(NodeMetric(decode.port, "pdserve:messenger_requests_retried_total"), 0);
  load.join();
  EXPECT_EQ(load_status, 200);
  EXPECT_EQ(NodeMetric(busy_d, "pdserve:decode_remote_prefills_total"), 1);
  for (const auto* group : {&c.prefill, &c.decode}) {
    for (const auto& n : *group) ExpectNodeDrained(n->port());
  }
}

// The headers llm-d's scheduler sets reach the same choice as pdserve's own; one naming a node
// the decode node does not know, or two naming different nodes, is refused with 400 and the
// reason, never served by another prefill node.
TEST(ExternalSchedulerTest, SidecarHeadersNameAKnownPrefillPeerOrAreRefused) {
  const Cluster c = StartCluster(2, 1);
  for (const auto& n : c.prefill) ASSERT_TRUE(n->ok()) << n->error();
  for (const auto& n : c.decode) ASSERT_TRUE(n->ok()) << n->error();
  ASSERT_TRUE(c.colocated && c.colocated->ok()) << (c.colocated ? c.colocated->error() : "");
  Result<ModelConfig> config = ModelConfig::Load(TinyModelDir());
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  const int d = c.decode[0]->port();
  ASSERT_EQ(WaitForMetric(d, "pdserve:messenger_peers_ready", 2, 10000), 2);
  const std::string p0 = PeerName(*c.prefill[0]), p1 = PeerName(*c.prefill[1]);
  // Two prompts of the same length: a decode node caches the KV it received, so a prompt sent
  // twice would not be asked of a prefill node again (docs/messenger.md, partial transfers).
  const std::vector<int32_t> prompts[] = {RandomPrompt(21, 5), RandomPrompt(21, 6)};
  const int64_t writes = PrefillWrites(*config, prompts[0]);

  // Each idle prefill node in turn: the older sidecar's x-prefiller-url (a URL) names P1,
  // x-prefiller-host-port P0; each computes exactly the request that named it (left to
  // itself, the decode node would send both to the same one: they are equally idle).
  const std::pair<std::string, std::string> pins[] = {{"x-prefiller-url", "http://" + p1},
                                                      {"x-prefiller-host-port", p0}};
  for (int i = 0; i < 2; ++i) {
    const Completion reference = Complete(c.colocated->port(), prompts[i], 4);
    ASSERT_EQ(reference.status, 200) << ErrorMessage(reference);
    const Completion got = Complete(d, prompts[i], 4, {{pins[i].first, pins[i].second}});
    ASSERT_EQ(got.status, 200) << pins[i].first << ": " << ErrorMessage(got);
    EXPECT_EQ(got.token_ids, reference.token_ids) << pins[i].first;
    const int named = i == 0 ? 1 : 0;
    EXPECT_EQ(WaitForMetric(c.prefill[named]->port(), "pdserve:messenger_kv_writes_sent_total",
                            static_cast<double>(writes), 5000),
              writes)
        << pins[i].first;
    EXPECT_EQ(NodeMetric(c.prefill[1 - named]->port(), "pdserve:messenger_kv_writes_sent_total"),
              i == 0 ? 0 : writes)
        << pins[i].first;
  }

  const std::pair<httplib::Headers, std::string> refused[] = {
      {{{"x-prefiller-host-port", "127.0.0.1:1"}}, "unknown prefill peer '127.0.0.1:1'"},
      {{{"x-prefiller-host-port", p1}, {"X-Prefill-Peer", p0}}, "names prefill node"},
      {{{"x-prefiller-host-port", "not-an-address"}}, "x-prefiller-host-port"}};
  for (const auto& [headers, reason] : refused) {
    const Completion r = Complete(d, RandomPrompt(21, 7), 4, headers);
    EXPECT_EQ(r.status, 400) << ErrorMessage(r);
    EXPECT_NE(ErrorMessage(r).find(reason), std::string::npos) << ErrorMessage(r);
  }
  // Nothing of the refused requests reached a prefill node.
  EXPECT_EQ(NodeMetric(d, "pdserve:decode_remote_prefills_total"), 2);
  EXPECT_EQ(NodeMetric(c.prefill[0]->port(), "pdserve:messenger_kv_writes_sent_total"), writes);
  EXPECT_EQ(NodeMetric(c.prefill[1]->port(), "pdserve:messenger_kv_writes_sent_total"), writes);
  ExpectNodeDrained(d);
}

}  // namespace
}  // namespace pdserve::testing
