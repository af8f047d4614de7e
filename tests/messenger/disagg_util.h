// Helpers of the disaggregation tests: a prefill node, a decode node pointed at it and a
// colocated reference node, all real `pdserve serve` processes (testing/node_process.h),
// and greedy completions by token ids over HTTP. Used from the test's main thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "testing/node_process.h"

namespace pdserve::testing {

inline constexpr char kClusterKey[] = "messenger-test-secret";

// ThreadSanitizer instruments every memory access of the model's kernels: a 2049-token prefill
// of the tiny model (chunks of 16) took ~100 s under TSan against ~7 s in Release, on the same
// loaded 2-core VM, nearly all of it forward passes (the transfer tail was 0.1 s). Tests that
// need a prefill lasting seconds, to act while it runs, size their prompts by the build.
#if defined(__SANITIZE_THREAD__)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif
// A prompt whose prefill in chunks of 16 tokens lasts seconds in this build (~2-7 s).
inline constexpr int kLongPromptTokens = kThreadSanitizer ? 385 : 2049;
// Tokens per KV page of the nodes whose tests count pages.
inline constexpr int kPage = 4;
// How long a decode node waits for a request's KV (retries included). It bounds a hang, it
// does not measure speed: long enough for a long prompt on a loaded host in a TSan build.
inline constexpr int kPrefillTimeoutMs = 60000;
// Flags of nodes that notice a lost peer quickly: a heartbeat every 100 ms, a peer silent for
// 1.5 s is removed (pages of 4 tokens, one thread).
inline const std::vector<std::string> kQuickPeerLossFlags = {
    "--page-size", "4", "--threads", "1", "--heartbeat-ms", "100", "--peer-timeout-ms", "1500"};

struct Completion {
  int status = 0;
  std::vector<int32_t> token_ids;
  nlohmann::json body;
  std::string retry_after;  // the Retry-After header ("" if none)
  double seconds = 0;       // from sending the request to the whole answer
};

// POST /v1/completions with prompt ids, greedy, ignore_eos, max_tokens.
Completion Complete(int port, const std::vector<int32_t>& prompt, int max_tokens,
                    const httplib::Headers& headers = {});
// A failed completion's "error" object as JSON text (the whole body if it has none).
std::string ErrorMessage(const Completion& c);

// `args`, then `more`.
std::vector<std::string> With(std::vector<std::string> args, const std::vector<std::string>& more);
// "127.0.0.1:PORT", the node as a decode node names a prefill peer.
std::string PeerName(const NodeProcess& node);

// A metric of a node (-1 if absent or the node does not answer).
double NodeMetric(int port, const std::string& name);
// Polls until the metric equals `value` (deadline ms); returns the last value seen.
double WaitForMetric(int port, const std::string& name, double value, int deadline_ms);

// GET path: its status and body (status 0 if the node does not answer).
std::pair<int, std::string> GetText(int port, const std::string& path);

// GET path as JSON (a discarded value if the node does not answer or the body is not JSON).
nlohmann::json GetJson(int port, const std::string& path);

// `length` random token ids of the tiny model's vocabulary, from `seed`.
std::vector<int32_t> RandomPrompt(int length, uint32_t seed);

// A client that goes away: opens a streamed POST /v1/completions over a raw socket, keeps the
// connection for hold_ms without reading (or, with `drop_when`, until it returns true, polled
// every 2 ms, hold_ms at most), then closes it. False if the request could not be sent at all.
bool StreamThenDrop(int port, const std::vector<int32_t>& prompt, int max_tokens, int hold_ms,
                    const std::function<bool()>& drop_when = {});

// Gtest expectations that a messenger node has no request in flight and no KV page in use
// (polled up to deadline_ms: releases run asynchronously).
void ExpectNodeDrained(int port, int deadline_ms = 10000);

// Flags of a prefill node and of a decode node pointed at `prefill_ports` (which prefills no
// prompt itself: --local-prefill-max-tokens 0, so `extra` must not repeat that flag).
std::vector<std::string> PrefillArgs(const std::string& provider,
                                     const std::vector<std::string>& extra = {});
std::vector<std::string> DecodeArgs(const std::string& provider,
                                    const std::vector<int>& prefill_ports,
                                    const std::vector<std::string>& extra = {});

}  // namespace pdserve::testing
