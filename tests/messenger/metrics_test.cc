// The messenger's /metrics after real disaggregated requests (docs/api.md): P's bytes and
// writes sent equal D's received and what the model's KV layout says for the prompt's pages,
// D's transfer latency histogram counted each transfer, nothing waits for KV or expired, and
// both page pools are back to zero of their (non-zero) totals. Also: a prefill node with
// --kv-streaming off returns the same greedy tokens (prefix-cache hits on either side:
// partial_transfer_test.cc). Real `pdserve serve` processes over tcp.
#include <algorithm>
#include <climits>
#include <set>

#include <gtest/gtest.h>
#include <httplib.h>

#include "disagg_util.h"
#include "model/config.h"

namespace pdserve::testing {
namespace {

const std::vector<std::string> kMetricsFlags = {"--page-size", std::to_string(kPage), "--kv-dtype",
                                                "bf16",        "--max-batch-tokens",  "8"};

// Bytes of the KV of `tokens` prefilled tokens: whole pages of every layer, K and V of every
// KV head, BF16 (TP 1: one write per page and layer).
struct Expected {
  int64_t writes = 0;
  int64_t bytes = 0;
};
Expected ExpectedTransfer(const ModelConfig& c, int tokens) {
  const int64_t pages = (tokens + kPage - 1) / kPage;
  const int64_t writes = pages * c.num_layers;
  return {writes, writes * 2 * c.num_kv_heads * kPage * c.head_dim * 2};
}

std::string MetricsText(int port) {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(5, 0);
  auto res = client.Get("/metrics");
  return res && res->status == 200 ? res->body : "";
}

TEST(MessengerMetricsTest, BothNodesCountTheSameTransfer) {
  NodeProcess prefill(TinyModelDir(), With(PrefillArgs("tcp"), kMetricsFlags));
  ASSERT_TRUE(prefill.ok()) << prefill.error();
  NodeProcess decode(TinyModelDir(), DecodeArgs("tcp", {prefill.port()}, kMetricsFlags));
  ASSERT_TRUE(decode.ok()) << decode.error();
  Result<ModelConfig> config = ModelConfig::Load(TinyModelDir());
  ASSERT_TRUE(config.ok()) << config.status().ToString();

  EXPECT_EQ(NodeMetric(prefill.port(), "pdserve:messenger_kv_bytes_sent_total"), 0);
  EXPECT_EQ(NodeMetric(decode.port(), "pdserve:messenger_kv_bytes_received_total"), 0);
  EXPECT_GT(NodeMetric(decode.port(), "pdserve:kv_pages_total"), 0);
  EXPECT_GT(NodeMetric(prefill.port(), "pdserve:kv_pages_total"), 0);

  Expected want;
  for (int length : {23, 41}) {  // not multiples of the page; several chunks of 8
    const Completion got = Complete(decode.port(), RandomPrompt(length, length), 3);
    ASSERT_EQ(got.status, 200) << got.body.dump();
    const Expected e = ExpectedTransfer(*config, length - 1);
    want.writes += e.writes;
    want.bytes += e.bytes;
  }
  ExpectNodeDrained(prefill.port());
  ExpectNodeDrained(decode.port());
  // P counts a write when it completed, possibly just after D counted it as landed.
  EXPECT_EQ(WaitForMetric(prefill.port(), "pdserve:messenger_kv_bytes_sent_total",
                          static_cast<double>(want.bytes), 5000),
            want.bytes);
  EXPECT_EQ(NodeMetric(prefill.port(), "pdserve:messenger_kv_writes_sent_total"), want.writes);
  EXPECT_EQ(NodeMetric(decode.port(), "pdserve:messenger_kv_bytes_received_total"), want.bytes);
  EXPECT_EQ(NodeMetric(decode.port(), "pdserve:messenger_kv_writes_received_total"), want.writes);

  const std::string d = MetricsText(decode.port());
  EXPECT_NE(d.find("# TYPE pdserve:messenger_kv_transfer_latency_seconds histogram"),
            std::string::npos)
      << d;
  EXPECT_EQ(NodeMetric(decode.port(), "pdserve:messenger_kv_transfer_latency_seconds_count"), 2);
  EXPECT_GT(NodeMetric(decode.port(), "pdserve:messenger_kv_transfer_latency_seconds_sum"), 0);
  EXPECT_NE(d.find("pdserve:messenger_kv_transfer_latency_seconds_bucket{le=\"+Inf\"} 2"),
            std::string::npos)
      << d;
  EXPECT_EQ(NodeMetric(decode.port(), "pdserve:messenger_requests_waiting_kv"), 0);
  EXPECT_EQ(NodeMetric(decode.port(), "pdserve:messenger_requests_expired_total"), 0);
  EXPECT_EQ(NodeMetric(prefill.port(), "pdserve:messenger_requests_expired_total"), 0);
  EXPECT_EQ(NodeMetric(decode.port(), "pdserve:messenger_requests_failed_total"), 0);
  EXPECT_EQ(NodeMetric(decode.port(), "pdserve:messenger_requests_retried_total"), 0);
  // Counts are exported as counters (one writer: common/metrics_text.h).
  const std::string text = GetText(decode.port(), "/metrics").second;
  for (const char* counter :
       {"pdserve:messenger_requests_retried_total", "pdserve:messenger_requests_failed_total",
        "pdserve:messenger_requests_cancelled_total", "pdserve:decode_remote_prefills_total"}) {
    EXPECT_NE(text.find(std::string("# TYPE ") + counter + " counter\n"), std::string::npos)
        << counter;
  }
  for (int port : {prefill.port(), decode.port()}) {
    EXPECT_EQ(WaitForMetric(port, "pdserve:kv_pages_used", 0, 5000), 0) << "port " << port;
  }
  // D's event log carries both ends of each transfer.
  const nlohmann::json events = GetJson(decode.port(), "/internal/messenger/events");
  ASSERT_TRUE(events.is_array());
  int sent = 0, landed = 0;
  for (const auto& e : events) {
    sent += e["kind"] == "prefill_sent";
    landed += e["kind"] == "kv_landed";
  }
  EXPECT_EQ(sent, 2);
  EXPECT_EQ(landed, 2);
}

TEST(MessengerMetricsTest, StreamingOffGivesTheSameTokens) {
  NodeProcess on(TinyModelDir(), With(PrefillArgs("tcp"), kMetricsFlags));
  ASSERT_TRUE(on.ok()) << on.error();
  NodeProcess off(TinyModelDir(),
                  With(PrefillArgs("tcp", {"--kv-streaming", "off"}), kMetricsFlags));
  ASSERT_TRUE(off.ok()) << off.error();
  // D without prefix caching: the same prompt twice would otherwise be a whole hit the second
  // time, and P would get nothing to stream.
  NodeProcess decode(TinyModelDir(), DecodeArgs("tcp", {on.port(), off.port()},
                                                With(kMetricsFlags, {"--no-prefix-caching"})));
  ASSERT_TRUE(decode.ok()) << decode.error();
  const std::vector<int32_t> prompt = RandomPrompt(45, 3);
  auto via = [&](int port) {
    return Complete(decode.port(), prompt, 5,
                    {{"X-Prefill-Peer", "127.0.0.1:" + std::to_string(port)}});
  };
  const Completion a = via(on.port());
  const Completion b = via(off.port());
  ASSERT_EQ(a.status, 200) << a.body.dump();
  ASSERT_EQ(b.status, 200) << b.body.dump();
  EXPECT_EQ(a.token_ids, b.token_ids);
  // With streaming off, P posted every write after its last layer: one writes_posted event
  // per layer, all of one step.
  const nlohmann::json events = GetJson(off.port(), "/internal/messenger/events");
  ASSERT_TRUE(events.is_array());
  std::set<uint64_t> steps;
  int64_t last_layer_done = 0, first_post = INT64_MAX;
  for (const auto& e : events) {
    if (e["kind"] == "writes_posted") {
      steps.insert(e["step"].get<uint64_t>());
      first_post = std::min<int64_t>(first_post, e["mono_us"]);
    }
    if (e["kind"] == "layer_done") last_layer_done = e["mono_us"];
  }
  EXPECT_EQ(steps.size(), 1u) << events.dump();
  EXPECT_GE(first_post, last_layer_done) << events.dump();
  ExpectNodeDrained(decode.port());
}

}  // namespace
}  // namespace pdserve::testing
