// `pdserve bench soak`: a reliability soak of the router in front of two nodes. It starts
// `pdserve router` and two `pdserve serve` nodes as child processes, keeps `concurrency`
// streamed completions in flight through the router, and SIGKILLs node B every `kill_every`
// (restarting it on the same port after `down_for`, and waiting until it is healthy) for
// `seconds`. Node A stays up. Then it judges:
//   - every request either completed with data: [DONE] or got a well-formed error (an HTTP
//     error status with an OpenAI-style JSON body, or an SSE error event); anything else (cut,
//     no [DONE], empty, malformed, timed out, refused) is a violation;
//   - once the load stops, both nodes' /metrics reach zero running and waiting requests and
//     zero KV cache pages in use.
// Call RunSoak from the main thread (the children die with the thread that spawned them).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "bench/serve_metrics.h"
#include "common/clock.h"
#include "common/status.h"

namespace pdserve::bench {

struct SoakOptions {
  std::string pdserve;    // the pdserve binary that runs the router and the nodes
  std::string model_dir;  // the nodes' model (small: the soak wants many requests)
  double seconds = 600;
  int concurrency = 8;
  Duration kill_every = std::chrono::seconds(5);
  Duration down_for = std::chrono::milliseconds(500);
  int max_tokens = 48;  // each request asks for 1..max_tokens tokens
  int node_threads = 1;
  Duration request_timeout = std::chrono::seconds(60);
  std::string log_dir;  // the children's stdout and stderr; required
  uint64_t seed = 0;
};

// The state of one node's engine once the load has stopped, from its /metrics.
struct SoakNodeState {
  std::string name;  // "A" (never killed) or "B"
  std::string url;
  bool reachable = false;
  double running = -1, waiting = -1, kv_cache_usage = -1;
  bool idle() const { return reachable && running == 0 && waiting == 0 && kv_cache_usage == 0; }
};

struct SoakReport {
  double seconds = 0;
  int concurrency = 0;
  int kills = 0;
  int restarts = 0;
  int requests = 0;
  int completed = 0;
  long long output_tokens = 0;
  std::map<std::string, int> well_formed;      // "HTTP 503", "SSE error event" -> count
  std::map<std::string, int> violations;       // FailureKindName -> count
  std::map<std::string, std::string> example;  // FailureKindName -> first error message
  std::vector<SoakNodeState> nodes;
  std::string aborted;  // why the soak stopped early (a node that did not come back); "" if not
  bool passed() const;
};

// Runs the soak; errors only for options or processes that cannot start. A run that finds
// violations returns a report whose passed() is false.
Result<SoakReport> RunSoak(const SoakOptions& options);

// The summary table printed at the end.
std::string FormatSoakReport(const SoakReport& report);

}  // namespace pdserve::bench
