// When `pdserve bench serve` sends each request: inter-arrival gaps drawn from a gamma
// distribution with shape = burstiness and mean 1/rate (burstiness 1: exponential, so the
// arrivals are a Poisson process; < 1 burstier, > 1 more even), as `vllm bench serve` does.
// Unlike vllm, the schedule is not rescaled to end at exactly n/rate: rescaling would make the
// gaps no longer independent draws of that distribution. Pure functions: safe from any thread.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace pdserve::bench {

struct ArrivalOptions {
  double request_rate = 0;  // requests per second; +inf: all at once
  double burstiness = 1;    // gamma shape, > 0
  uint64_t seed = 0;
};

// InvalidArgument unless rate > 0 (or +inf) and burstiness > 0 and finite.
Status ValidateArrivals(const ArrivalOptions& options);

// `n` gaps in seconds; the first is the wait before the first request. All 0 for an infinite
// rate. Precondition: ValidateArrivals(options).ok().
std::vector<double> InterArrivalGaps(int n, const ArrivalOptions& options);

// Send times in seconds from the start of the run: the running sum of the gaps.
std::vector<double> ArrivalTimes(int n, const ArrivalOptions& options);

}  // namespace pdserve::bench
