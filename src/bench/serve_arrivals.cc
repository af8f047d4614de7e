#include "bench/serve_arrivals.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "common/check.h"

namespace pdserve::bench {

Status ValidateArrivals(const ArrivalOptions& options) {
  if (!(options.request_rate > 0)) {
    return Status::InvalidArgument("--request-rate must be positive (or inf)");
  }
  if (!(options.burstiness > 0) || !std::isfinite(options.burstiness)) {
    return Status::InvalidArgument("--burstiness must be a positive number");
  }
  return Status::Ok();
}

std::vector<double> InterArrivalGaps(int n, const ArrivalOptions& options) {
  PD_CHECK(ValidateArrivals(options).ok());
  std::vector<double> gaps(static_cast<size_t>(std::max(n, 0)), 0.0);
  if (std::isinf(options.request_rate)) return gaps;
  // Gamma(k, theta) has mean k * theta: theta = 1 / (rate * k) keeps the mean at 1 / rate.
  std::mt19937_64 rng(options.seed);
  std::gamma_distribution<double> gamma(options.burstiness,
                                        1.0 / (options.request_rate * options.burstiness));
  for (double& gap : gaps) gap = gamma(rng);
  return gaps;
}

std::vector<double> ArrivalTimes(int n, const ArrivalOptions& options) {
  std::vector<double> times = InterArrivalGaps(n, options);
  for (size_t i = 1; i < times.size(); ++i) times[i] += times[i - 1];
  return times;
}

}  // namespace pdserve::bench
