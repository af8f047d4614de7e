// The plots of `pdserve bench sweep` (serve_sweep.h), drawn by gnuplot (Debian's gnuplot-nox,
// run as a child process) into RESULT_DIR/plots/:
//   itl_cdf.png         CDF of every inter-token latency, one line per deployment, at one rate
//   ttft_vs_rate.png    median and tail TTFT versus request rate
//   itl_vs_rate.png     tail (p99) and median ITL versus request rate
//   goodput_vs_rate.png goodput (with --goodput SLOs) and throughput versus request rate
// Beside them: the data each was drawn from (itl_cdf_NAME.dat, NAME_vs_rate.dat, plain
// columns) and sweep.gp, the script that draws them all again (`cd plots && gnuplot sweep.gp`).
// The rate axis places "inf" one step beyond the highest finite rate. Call from one thread.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "bench/serve_sweep.h"
#include "common/clock.h"
#include "common/status.h"

namespace pdserve::bench {

struct SweepPlotOptions {
  // The rate of the ITL CDF; default: the highest rate every deployment ran.
  std::optional<double> cdf_rate;
  std::string gnuplot = "gnuplot";  // program name or path
  Duration timeout = std::chrono::seconds(120);
};

struct SweepPlots {
  std::vector<std::string> pngs;  // paths of the PNGs drawn
  double cdf_rate = 0;
};

// Writes the data files and sweep.gp, then runs gnuplot on the script. NotFound (saying how
// to install it) when the gnuplot program is absent: the data and script are written first
// all the same. InvalidArgument when there is no run, or no run at cdf_rate.
Result<SweepPlots> DrawSweepPlots(const std::vector<SweepRun>& runs, const std::string& result_dir,
                                  const SweepPlotOptions& options);

}  // namespace pdserve::bench
