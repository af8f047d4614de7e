// `pdserve bench sweep` against two scripted servers standing for two deployments, at two
// rates: one result file per run with the script's counts, the summary JSON/CSV, and the PNG
// plots with the data they were drawn from.
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "bench/serve_sweep.h"
#include "bench/sweep_plots.h"
#include "scripted_server.h"
#include "testing/test_paths.h"

namespace pdserve::bench {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

bool InPath(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path != nullptr ? path : "");
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    if (!dir.empty() && access((dir + "/" + program).c_str(), X_OK) == 0) return true;
  }
  return false;
}

std::vector<std::vector<std::string>> ReadCsv(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::vector<std::string>> rows;
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    std::stringstream ss(line);
    std::string cell;
    while (std::getline(ss, cell, ',')) cells.push_back(cell);
    if (!line.empty() && line.back() == ',') cells.emplace_back();
    rows.push_back(cells);
  }
  return rows;
}

// Data lines (not comments) of a .dat file.
std::vector<std::string> DataLines(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] != '#') lines.push_back(line);
  }
  return lines;
}

TEST(ServeSweepTest, ParsesRatesAndDeployments) {
  auto rates = ParseRates("inf,2,0.5");
  ASSERT_TRUE(rates.ok()) << rates.status().ToString();
  ASSERT_EQ(rates->size(), 3u);
  EXPECT_EQ((*rates)[0], 0.5);
  EXPECT_TRUE(std::isinf((*rates)[2]));
  EXPECT_EQ(RateLabel((*rates)[0]), "0.5");
  EXPECT_EQ(RateLabel((*rates)[2]), "inf");
  EXPECT_FALSE(ParseRates("1,1").ok());
  EXPECT_FALSE(ParseRates("0").ok());
  EXPECT_FALSE(ParseRates("2x").ok());
  EXPECT_FALSE(ParseRates("").ok());
  auto d = ParseDeployment("1p1d=http://127.0.0.1:8000");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->name, "1p1d");
  EXPECT_EQ(d->base_url, "http://127.0.0.1:8000");
  EXPECT_FALSE(ParseDeployment("http://127.0.0.1:8000").ok());
  EXPECT_FALSE(ParseDeployment("a/b=http://127.0.0.1:8000").ok());
  EXPECT_FALSE(ParseDeployment("a=ftp://x").ok());
}

TEST(ServeSweepTest, TwoDeploymentsTwoRatesGiveRunsSummaryAndPlots) {
  // "fast" answers every prompt; "slow" is slower and fails prompt "bad" with HTTP 500.
  ScriptedServer fast(
      {{"*", {.prompt_len = 10, .ttft_ms = 20, .gaps_ms = {10, 10, 10}, .usage_tokens = 4}}});
  ScriptedServer slow(
      {{"*", {.prompt_len = 10, .ttft_ms = 60, .gaps_ms = {30, 30}, .usage_tokens = 3}},
       {"bad", {.prompt_len = 10, .status = 500, .gaps_ms = {}}}});
  const std::string dir = testing::MakeTempDir("serve_sweep");
  {
    std::ofstream out(dir + "/prompts.jsonl");
    for (const char* p : {"p0", "p1", "bad", "p3", "p4", "p5"}) {
      out << json{{"prompt", p}, {"output_len", 4}, {"prompt_len", 10}}.dump() << "\n";
    }
  }
  SweepOptions options;
  options.deployments = {{"fast", fast.url()}, {"slow", slow.url()}};
  options.rates = *ParseRates("20,inf");
  options.bench.model = "scripted";
  options.bench.request_timeout = std::chrono::seconds(20);
  options.bench.print_table = false;
  options.dataset.name = "jsonl";
  options.dataset.path = dir + "/prompts.jsonl";
  options.dataset.random.num_prompts = 3;  // per rate: rate 20 sends p0 p1 bad, inf p3 p4 p5
  options.result_dir = dir + "/sweep";
  auto ran = RunServeSweep(options);
  ASSERT_TRUE(ran.ok()) << ran.status().ToString();
  EXPECT_EQ(ran->size(), 4u);
  // Each rate has its own prompts: every prompt reached each server exactly once.
  for (const char* p : {"p0", "p1", "bad", "p3", "p4", "p5"}) {
    EXPECT_EQ(fast.requests_for(p), 1) << p;
    EXPECT_EQ(slow.requests_for(p), 1) << p;
  }

  auto runs = LoadSweepRuns(options.result_dir);
  ASSERT_TRUE(runs.ok()) << runs.status().ToString();
  ASSERT_EQ(runs->size(), 4u);
  // (deployment, rate label, completed, failed), in the order the runs load.
  const std::vector<std::tuple<std::string, std::string, int, int>> expected = {
      {"fast", "20", 3, 0}, {"fast", "inf", 3, 0}, {"slow", "20", 2, 1}, {"slow", "inf", 3, 0}};
  for (size_t i = 0; i < expected.size(); ++i) {
    const auto& [name, rate, completed, failed] = expected[i];
    const SweepRun& run = (*runs)[i];
    EXPECT_EQ(run.deployment, name);
    EXPECT_EQ(RateLabel(run.rate), rate);
    EXPECT_EQ(run.result["completed"], completed) << name << " " << rate;
    EXPECT_EQ(run.result["failed"], failed) << name << " " << rate;
    EXPECT_EQ(run.result["num_prompts"], 3);
    EXPECT_TRUE(fs::exists(options.result_dir + "/runs/" + name + "_rate-" + rate + ".json"));
  }

  ASSERT_TRUE(WriteSweepSummary(*runs, options.result_dir).ok());
  std::ifstream summary_in(options.result_dir + "/sweep.json");
  const json summary = json::parse(summary_in);
  ASSERT_EQ(summary["runs"].size(), 4u);
  EXPECT_FALSE(summary["runs"][0].contains("itls"));  // per-request lists stay in runs/
  const auto csv = ReadCsv(options.result_dir + "/sweep.csv");
  ASSERT_EQ(csv.size(), 5u);
  const std::vector<std::string>& header = csv[0];
  auto column = [&](const std::string& name) {
    const auto it = std::find(header.begin(), header.end(), name);
    EXPECT_NE(it, header.end()) << name;
    return static_cast<size_t>(it - header.begin());
  };
  for (size_t i = 0; i < expected.size(); ++i) {
    const auto& [name, rate, completed, failed] = expected[i];
    const std::vector<std::string>& row = csv[i + 1];
    ASSERT_EQ(row.size(), header.size());
    EXPECT_EQ(row[column("deployment")], name);
    EXPECT_EQ(row[column("request_rate")], rate);
    EXPECT_EQ(std::stoi(row[column("completed")]), completed);
    EXPECT_EQ(std::stoi(row[column("failed")]), failed);
    const double p99_itl = std::stod(row[column("p99_itl_ms")]);
    EXPECT_NEAR(p99_itl, (*runs)[i].result["p99_itl_ms"].get<double>(), 1e-3 * p99_itl);
    EXPECT_NEAR(p99_itl, name == "fast" ? 10 : 30, kTolMs) << name << " " << rate;
  }

  if (!InPath("gnuplot")) {
    GTEST_SKIP() << "SKIPPED LOUDLY: gnuplot is not installed (Debian: apt-get install "
                    "gnuplot-nox, or scripts/install-deps.sh); the runs, JSON and CSV were "
                    "checked, the PNG plots were not";
  }
  auto plots = DrawSweepPlots(*runs, options.result_dir, {});
  ASSERT_TRUE(plots.ok()) << plots.status().ToString();
  EXPECT_TRUE(std::isinf(plots->cdf_rate));  // the highest rate both deployments ran
  ASSERT_EQ(plots->pngs.size(), 4u);
  for (const std::string& png : plots->pngs) {
    std::ifstream in(png, std::ios::binary);
    std::string head(8, '\0');
    in.read(head.data(), 8);
    EXPECT_EQ(head, "\x89PNG\r\n\x1a\n") << png;
    EXPECT_GT(fs::file_size(png), 2000u) << png;
  }
  // The CDF data: every ITL of the run at that rate (3 requests x chunks - 1), ending at 1.
  const fs::path plot_dir = options.result_dir + "/plots";
  const auto fast_cdf = DataLines(plot_dir / "itl_cdf_fast.dat");
  const auto slow_cdf = DataLines(plot_dir / "itl_cdf_slow.dat");
  ASSERT_EQ(fast_cdf.size(), 9u);
  ASSERT_EQ(slow_cdf.size(), 6u);
  EXPECT_EQ(fast_cdf.back().substr(fast_cdf.back().find(' ') + 1), "1");
  EXPECT_EQ(DataLines(plot_dir / "fast_vs_rate.dat").size(), 2u);
  EXPECT_TRUE(fs::exists(plot_dir / "sweep.gp"));

  SweepPlotOptions missing;
  missing.gnuplot = "pdserve-no-such-gnuplot";
  EXPECT_EQ(DrawSweepPlots(*runs, options.result_dir, missing).status().code(),
            StatusCode::kNotFound);
}

}  // namespace
}  // namespace pdserve::bench
