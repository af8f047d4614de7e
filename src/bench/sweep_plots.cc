#include "bench/sweep_plots.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <fmt/format.h>

#include "common/subprocess.h"

namespace pdserve::bench {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A CDF line keeps at most this many points: enough for a smooth curve and its tail.
constexpr size_t kMaxCdfPoints = 4000;

// The deployments in the order their runs come, each once.
std::vector<std::string> Deployments(const std::vector<SweepRun>& runs) {
  std::vector<std::string> names;
  for (const SweepRun& r : runs) {
    if (std::find(names.begin(), names.end(), r.deployment) == names.end()) {
      names.push_back(r.deployment);
    }
  }
  return names;
}

// Where each rate sits on the x axis: itself, and inf one step (the mean gap between finite
// rates, or the highest rate) beyond the highest finite one.
double InfPosition(const std::vector<SweepRun>& runs) {
  std::set<double> finite;
  for (const SweepRun& r : runs) {
    if (!std::isinf(r.rate)) finite.insert(r.rate);
  }
  if (finite.empty()) return 1;
  const double hi = *finite.rbegin(), lo = *finite.begin();
  const double step = finite.size() > 1 ? (hi - lo) / static_cast<double>(finite.size() - 1) : hi;
  return hi + step;
}

double Position(double rate, double inf_at) { return std::isinf(rate) ? inf_at : rate; }

// The tail percentile the rate plots show: p99 when reported, else the highest one reported.
std::string TailName(const std::vector<SweepRun>& runs, const std::string& metric) {
  double best = -1;
  for (const SweepRun& r : runs) {
    for (const auto& [key, value] : r.result.items()) {
      const std::string suffix = "_" + metric + "_ms";
      if (key[0] != 'p' || key.size() <= suffix.size() ||
          key.compare(key.size() - suffix.size(), suffix.size(), suffix) != 0) {
        continue;
      }
      const double p = std::strtod(key.c_str() + 1, nullptr);
      if (p == 99) return "p99";
      best = std::max(best, p);
    }
  }
  return best > 0 ? fmt::format("p{:g}", best) : "";
}

// A number for a .dat file; NaN (gnuplot skips the point) when absent or not measured.
std::string Num(const json& result, const std::string& key) {
  const auto it = result.find(key);
  if (it == result.end() || !it->is_number()) return "NaN";
  return fmt::format("{:.6g}", it->get<double>());
}

// NAME_vs_rate.dat: one row per rate of that deployment.
std::string RateData(const std::vector<SweepRun>& runs, const std::string& name, double inf_at,
                     const std::string& ttft_tail, const std::string& itl_tail) {
  std::string out = fmt::format(
      "# deployment {}: x request_rate median_ttft_ms {}_ttft_ms median_itl_ms {}_itl_ms "
      "request_throughput request_goodput completed failed\n",
      name, ttft_tail, itl_tail);
  for (const SweepRun& r : runs) {
    if (r.deployment != name) continue;
    const json& j = r.result;
    // A run where nothing completed has no latencies (its zeros are not measurements).
    const bool measured = j.value("completed", 0) > 0;
    auto ms = [&](const std::string& key) { return measured ? Num(j, key) : "NaN"; };
    out += fmt::format("{:.6g} {} {} {} {} {} {} {} {} {}\n", Position(r.rate, inf_at),
                       RateLabel(r.rate), ms("median_ttft_ms"), ms(ttft_tail + "_ttft_ms"),
                       ms("median_itl_ms"), ms(itl_tail + "_itl_ms"), Num(j, "request_throughput"),
                       Num(j, "request_goodput"), j.value("completed", 0), j.value("failed", 0));
  }
  return out;
}

// itl_cdf_NAME.dat: every ITL in ms, sorted, with the fraction of ITLs at or below it.
std::string CdfData(const SweepRun& run) {
  std::vector<double> itls;
  if (const auto it = run.result.find("itls"); it != run.result.end() && it->is_array()) {
    for (const json& request : *it) {
      if (!request.is_array()) continue;
      for (const json& s : request) {
        if (s.is_number()) itls.push_back(s.get<double>() * 1000);
      }
    }
  }
  std::sort(itls.begin(), itls.end());
  std::string out =
      fmt::format("# deployment {} at rate {}: itl_ms fraction_at_or_below ({} ITLs)\n",
                  run.deployment, RateLabel(run.rate), itls.size());
  const size_t n = itls.size();
  const size_t step = n > kMaxCdfPoints ? n / kMaxCdfPoints : 1;
  for (size_t i = 0; i < n; i += step) {
    // The last of equal values carries their fraction; the max is always written.
    out += fmt::format("{:.6g} {:.6g}\n", itls[i], static_cast<double>(i + 1) / n);
  }
  if (n > 0 && (n - 1) % step != 0) out += fmt::format("{:.6g} 1\n", itls[n - 1]);
  return out;
}

std::string XTics(const std::vector<SweepRun>& runs, double inf_at) {
  std::set<double> rates;
  for (const SweepRun& r : runs) rates.insert(r.rate);
  std::string tics;
  for (double rate : rates) {
    tics += fmt::format("{}\"{}\" {:.6g}", tics.empty() ? "" : ", ", RateLabel(rate),
                        Position(rate, inf_at));
  }
  return "set xtics (" + tics + ")\n";
}

// One `plot` command over every deployment's file; `series` gives (column, title suffix,
// dash type) for each line of a deployment.
std::string PlotRates(const std::vector<std::string>& names,
                      const std::vector<std::tuple<int, std::string, int>>& series) {
  std::string cmd = "plot ";
  for (size_t d = 0; d < names.size(); ++d) {
    for (const auto& [column, suffix, dash] : series) {
      if (cmd.size() > 5) cmd += ", \\\n     ";
      cmd += fmt::format(
          "'{}_vs_rate.dat' using 1:{} with linespoints lw 2 pt 7 lc {} dt {} title '{} {}'",
          names[d], column, d + 1, dash, names[d], suffix);
    }
  }
  return cmd + "\n";
}

std::string Script(const std::vector<SweepRun>& runs, const std::vector<std::string>& names,
                   const std::vector<std::string>& cdf_names, double cdf_rate, double inf_at,
                   const std::string& ttft_tail, const std::string& itl_tail, bool has_goodput) {
  std::string s =
      "# Drawn by `pdserve bench sweep` from the .dat files beside this script.\n"
      "# Draw again: cd into this directory, then `gnuplot sweep.gp`.\n"
      "set terminal pngcairo size 960,600 noenhanced font ',11'\n"
      "set grid\nset key top left\n";
  s += fmt::format(
      "set output 'itl_cdf.png'\nset title 'Inter-token latency CDF at {} req/s'\n"
      "set xlabel 'inter-token latency (ms, log scale)'\nset ylabel 'fraction of ITLs at or "
      "below'\nset logscale x\nset yrange [0:1.02]\nset key bottom right\nplot ",
      RateLabel(cdf_rate));
  for (size_t d = 0; d < cdf_names.size(); ++d) {
    // The same colour as the deployment's lines in the rate plots.
    const size_t colour = std::find(names.begin(), names.end(), cdf_names[d]) - names.begin() + 1;
    s += fmt::format("{}'itl_cdf_{}.dat' using 1:2 with steps lw 2 lc {} title '{}'",
                     d ? ", \\\n     " : "", cdf_names[d], colour, cdf_names[d]);
  }
  s += "\nunset logscale x\nset autoscale y\nset key top left\n";
  s += XTics(runs, inf_at);
  s += fmt::format("set xrange [0:{:.6g}]\nset xlabel 'request rate (req/s)'\n", inf_at * 1.08);
  s += fmt::format(
      "set output 'ttft_vs_rate.png'\nset title 'TTFT versus request rate (solid: median, "
      "dashed: {})'\nset ylabel 'TTFT (ms, log scale)'\nset logscale y\n",
      ttft_tail);
  s += PlotRates(names, {{3, "median", 1}, {4, ttft_tail, 2}});
  s += fmt::format(
      "set output 'itl_vs_rate.png'\nset title 'Inter-token latency versus request rate (solid: "
      "{}, dashed: median)'\nset ylabel 'ITL (ms, log scale)'\n",
      itl_tail);
  s += PlotRates(names, {{6, itl_tail, 1}, {5, "median", 2}});
  s += "unset logscale y\nset yrange [0:*]\nset output 'goodput_vs_rate.png'\nset ylabel "
       "'requests/s'\n";
  if (has_goodput) {
    s += "set title 'Goodput (solid) and throughput (dashed) versus request rate'\n";
    s += PlotRates(names, {{8, "goodput", 1}, {7, "throughput", 2}});
  } else {
    s += "set title 'Throughput versus request rate (no --goodput SLO given: no goodput)'\n";
    s += PlotRates(names, {{7, "throughput", 2}});
  }
  return s;
}

Status RunGnuplot(const SweepPlotOptions& options, const fs::path& plots) {
  // gnuplot resolves the script's relative file names against its working directory.
  SubprocessOptions sp;
  std::string dir = plots.string();
  std::string quoted;
  for (char c : dir) quoted += c == '\'' ? std::string("''") : std::string(1, c);
  // The script is named after the cd: a relative result directory would otherwise be
  // resolved twice.
  sp.argv = {options.gnuplot, "-e", "cd '" + quoted + "'", "sweep.gp"};
  sp.stdin_mode = StdStream::kNull;
  sp.stdout_mode = StdStream::kPipe;
  sp.stderr_mode = StdStream::kPipe;
  auto child = Subprocess::Spawn(sp);
  if (!child.ok()) {
    if (child.status().code() == StatusCode::kInvalidArgument) {
      return Status::NotFound("gnuplot not found (" + child.status().message() +
                              "): install it (Debian: apt-get install gnuplot-nox, or "
                              "scripts/install-deps.sh), then rerun with --plot-only");
    }
    return child.status();
  }
  const Deadline deadline = Deadline::After(options.timeout);
  auto read = child->ReadAll(deadline);
  const std::string output = read.ok() ? *read : read.status().ToString();
  PD_ASSIGN_OR_RETURN(ExitStatus exit, child->WaitFor(deadline));
  if (!exit.success()) {
    return Status::Internal("gnuplot " + exit.ToString() + " on " + (plots / "sweep.gp").string() +
                            ": " + output.substr(0, 2000));
  }
  return Status::Ok();
}

}  // namespace

Result<SweepPlots> DrawSweepPlots(const std::vector<SweepRun>& runs, const std::string& result_dir,
                                  const SweepPlotOptions& options) {
  if (runs.empty()) return Status::InvalidArgument("no sweep run to plot");
  const std::vector<std::string> names = Deployments(runs);
  SweepPlots plots;
  if (options.cdf_rate) {
    plots.cdf_rate = *options.cdf_rate;
  } else {
    // The highest rate that every deployment ran.
    std::map<double, std::set<std::string>> by_rate;
    for (const SweepRun& r : runs) by_rate[r.rate].insert(r.deployment);
    plots.cdf_rate = -1;
    for (const auto& [rate, who] : by_rate) {
      if (who.size() == names.size()) plots.cdf_rate = rate;
    }
    if (plots.cdf_rate < 0) plots.cdf_rate = by_rate.rbegin()->first;
  }

  const fs::path dir = fs::path(result_dir) / "plots";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::IoError("cannot create " + dir.string() + ": " + ec.message());
  const double inf_at = InfPosition(runs);
  const std::string ttft_tail = TailName(runs, "ttft"), itl_tail = TailName(runs, "itl");
  std::vector<std::string> cdf_names;
  bool has_goodput = false;
  for (const std::string& name : names) {
    PD_RETURN_IF_ERROR(WriteTextFile(dir / (name + "_vs_rate.dat"),
                                     RateData(runs, name, inf_at, ttft_tail, itl_tail)));
  }
  for (const SweepRun& r : runs) {
    has_goodput = has_goodput || r.result.value("request_goodput", json()).is_number();
    if (r.rate == plots.cdf_rate) {
      PD_RETURN_IF_ERROR(WriteTextFile(dir / ("itl_cdf_" + r.deployment + ".dat"), CdfData(r)));
      cdf_names.push_back(r.deployment);
    }
  }
  if (cdf_names.empty()) {
    return Status::InvalidArgument("--cdf-rate " + RateLabel(plots.cdf_rate) +
                                   ": no deployment ran at that rate");
  }
  PD_RETURN_IF_ERROR(WriteTextFile(
      dir / "sweep.gp",
      Script(runs, names, cdf_names, plots.cdf_rate, inf_at, ttft_tail, itl_tail, has_goodput)));
  PD_RETURN_IF_ERROR(RunGnuplot(options, dir));
  for (const char* png :
       {"itl_cdf.png", "ttft_vs_rate.png", "itl_vs_rate.png", "goodput_vs_rate.png"}) {
    plots.pngs.push_back((dir / png).string());
  }
  return plots;
}

}  // namespace pdserve::bench
