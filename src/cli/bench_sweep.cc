// `pdserve bench sweep`: its flags; the sweep is bench/serve_sweep.h, its plots
// bench/sweep_plots.h.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench/serve_sweep.h"
#include "bench/sweep_plots.h"
#include "cli/bench_serve_flags.h"
#include "cli/commands.h"
#include "cli/model_flags.h"

namespace pdserve::cli {
namespace {

struct BenchSweepFlags {
  ServeRunFlags run;
  std::vector<std::string> deployments;
  std::string rates = "1,2,4,inf";
  std::string result_dir;
  std::string cdf_rate;
  bool no_plots = false;
  bool plot_only = false;
};

// Rebuilds sweep.json, sweep.csv and the plots from every run in the directory.
int Summarize(const BenchSweepFlags& f) {
  PD_ASSIGN_OR_RETURN_CLI(std::vector<bench::SweepRun> runs, bench::LoadSweepRuns(f.result_dir));
  if (Status s = bench::WriteSweepSummary(runs, f.result_dir); !s.ok()) return Fail(s.ToString());
  std::printf("bench sweep: %zu runs summarized in %s/sweep.json and sweep.csv\n", runs.size(),
              f.result_dir.c_str());
  if (f.no_plots) return 0;
  bench::SweepPlotOptions plot;
  if (!f.cdf_rate.empty()) {
    PD_ASSIGN_OR_RETURN_CLI(std::vector<double> rate, bench::ParseRates(f.cdf_rate));
    if (rate.size() != 1) return Fail("--cdf-rate takes one rate");
    plot.cdf_rate = rate[0];
  }
  auto plots = bench::DrawSweepPlots(runs, f.result_dir, plot);
  if (plots.status().code() == StatusCode::kNotFound) {
    // The data and the script are written: the sweep's measurements are not lost.
    std::fprintf(stderr, "warning: no plots: %s\n", plots.status().message().c_str());
    return 0;
  }
  if (!plots.ok()) return Fail(plots.status().ToString());
  for (const std::string& png : plots->pngs) std::printf("bench sweep: plot %s\n", png.c_str());
  std::fflush(stdout);
  return 0;
}

int RunBenchSweep(BenchSweepFlags& f) {
  if (f.plot_only) return Summarize(f);
  bench::SweepOptions options;
  for (const std::string& d : f.deployments) {
    PD_ASSIGN_OR_RETURN_CLI(bench::SweepDeployment deployment, bench::ParseDeployment(d));
    options.deployments.push_back(std::move(deployment));
  }
  if (options.deployments.empty()) return Fail("--deployment NAME=URL is required");
  PD_ASSIGN_OR_RETURN_CLI(options.rates, bench::ParseRates(f.rates));
  PD_ASSIGN_OR_RETURN_CLI(options.bench, ServeOptionsFromFlags(&f.run));
  options.dataset = f.run.dataset;
  options.result_dir = f.result_dir;
  PD_ASSIGN_OR_RETURN_CLI(std::vector<bench::SweepRun> runs, bench::RunServeSweep(options));
  int failed_runs = 0;
  for (const bench::SweepRun& run : runs) failed_runs += run.result.value("completed", 0) == 0;
  const int code = Summarize(f);
  if (code != 0) return code;
  // A run where every request failed measured nothing: say so through the exit code.
  return failed_runs == 0 ? 0
                          : Fail(std::to_string(failed_runs) +
                                 " run(s) completed no request; see their errors in runs/");
}

}  // namespace

void AddBenchSweepCommand(CLI::App& bench, int* exit_code) {
  auto flags = std::make_shared<BenchSweepFlags>();
  CLI::App* cmd = bench.add_subcommand(
      "sweep", "bench serve at several request rates against several deployments, with plots");
  cmd->add_option("--deployment", flags->deployments,
                  "NAME=BASE_URL of a deployment to sweep; repeat for several (same model)");
  cmd->add_option("--rates", flags->rates, "Request rates, comma-separated (inf: all at once)")
      ->capture_default_str();
  cmd->add_option("--result-dir", flags->result_dir,
                  "Directory of the sweep: runs/, sweep.json, sweep.csv, plots/ (runs of other "
                  "deployments already there are kept and plotted too)")
      ->required();
  cmd->add_option("--cdf-rate", flags->cdf_rate,
                  "Rate of the ITL CDF plot (default: the highest rate every deployment ran)");
  cmd->add_flag("--no-plots", flags->no_plots, "Write the data, draw no PNG");
  cmd->add_flag("--plot-only", flags->plot_only,
                "Run nothing: rebuild sweep.json, sweep.csv and the plots from runs/");
  AddServeRunFlags(cmd, &flags->run, "Timed requests per rate");
  cmd->callback([flags, exit_code] { *exit_code = RunBenchSweep(*flags); });
}

}  // namespace pdserve::cli
