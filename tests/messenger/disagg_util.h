// Helpers of the disaggregation tests: a prefill node, a decode node pointed at it and a
// colocated reference node, all real `pdserve serve` processes (tests/server/node_process.h),
// and greedy completions by token ids over HTTP. Used from the test's main thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "node_process.h"

namespace pdserve::testing {

inline constexpr char kClusterKey[] = "messenger-test-secret";

struct Completion {
  int status = 0;
  std::vector<int32_t> token_ids;
  nlohmann::json body;
};

// POST /v1/completions with prompt ids, greedy, ignore_eos, max_tokens.
Completion Complete(int port, const std::vector<int32_t>& prompt, int max_tokens,
                    const httplib::Headers& headers = {});

// A metric of a node (-1 if absent or the node does not answer).
double NodeMetric(int port, const std::string& name);
// Polls until the metric equals `value` (deadline ms); returns the last value seen.
double WaitForMetric(int port, const std::string& name, double value, int deadline_ms);

// Flags of a prefill node and of a decode node pointed at `prefill_ports`.
std::vector<std::string> PrefillArgs(const std::string& provider,
                                     const std::vector<std::string>& extra = {});
std::vector<std::string> DecodeArgs(const std::string& provider,
                                    const std::vector<int>& prefill_ports,
                                    const std::vector<std::string>& extra = {});

}  // namespace pdserve::testing
