// `pdserve bench sweep`: `bench serve` (serve_bench.h) run at each of several request rates
// against each of several deployments of the same model, with the same prompts, arrivals seed
// and options for every deployment. The result directory is the sweep:
//   runs/NAME_rate-R.json  one vllm-style result per (deployment, rate), plus "deployment"
//   sweep.json, sweep.csv  one summary row per run (every scalar field of the run's result)
//   plots/                 PNGs and the data and gnuplot script they were drawn from
//                          (sweep_plots.h)
// The summaries and plots are rebuilt from every run file in the directory, so deployments
// that cannot be up at the same time (the experiment's two, on the same cores) are swept one
// after the other into one directory. Rate i of a sweep sends prompts [i*n, (i+1)*n) of one
// seeded dataset of n * rates prompts: no rate repeats another's prompts, and every
// deployment gets the same ones.
// Call from one thread (RunServeSweep runs the requests on threads of its own).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/serve_bench.h"
#include "common/status.h"

namespace pdserve::bench {

struct SweepDeployment {
  std::string name;  // [A-Za-z0-9._-]+: it names files
  std::string base_url;
};

// "NAME=URL"; InvalidArgument names what is wrong.
Result<SweepDeployment> ParseDeployment(const std::string& text);
// "0.5,1,2,inf": positive rates or inf, no duplicates; returned in ascending order, inf last.
Result<std::vector<double>> ParseRates(const std::string& text);
// "0.5", "inf": how a rate is written in file names, the CSV and plot labels.
std::string RateLabel(double rate);

struct SweepOptions {
  std::vector<SweepDeployment> deployments;
  std::vector<double> rates;
  // Every option of one run; base_url, request_rate and result_file are set per run.
  ServeBenchOptions bench;
  // num_prompts is per rate. Its tokens are counted by the first deployment's server unless
  // tokenizer_dir is set.
  ServeDatasetOptions dataset;
  std::string result_dir;
};

// One run of a sweep: its deployment, its rate and its vllm-style result.
struct SweepRun {
  std::string deployment;
  double rate = 0;
  nlohmann::json result;
};

// Runs every (deployment, rate) in that order and writes runs/*.json. A deployment that fails
// every request is recorded as such (failed = num_prompts), not an error; errors are for bad
// options, a dataset that cannot be built, or files that cannot be written.
Result<std::vector<SweepRun>> RunServeSweep(const SweepOptions& options);

// Every run file under result_dir/runs, ordered by deployment name then rate (inf last).
// InvalidArgument names a file that is not a run result.
Result<std::vector<SweepRun>> LoadSweepRuns(const std::string& result_dir);

// sweep.json and sweep.csv from `runs`.
Status WriteSweepSummary(const std::vector<SweepRun>& runs, const std::string& result_dir);

// Writes `text` as the whole of `path`; IoError if it cannot (the sweep's and its plots' files).
Status WriteTextFile(const std::filesystem::path& path, const std::string& text);

// The CSV's columns: deployment, request_rate, then the scalar metrics present in the runs.
std::vector<std::string> SweepCsvColumns(const std::vector<SweepRun>& runs);

}  // namespace pdserve::bench
