#include "bench/serve_sweep.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>

namespace pdserve::bench {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr double kInf = std::numeric_limits<double>::infinity();

bool ValidName(const std::string& name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

// "inf" or a number, as the result file writes request_rate.
Result<double> RateFromJson(const json& value) {
  if (value.is_number()) return value.get<double>();
  if (value.is_string() && value.get<std::string>() == "inf") return kInf;
  return Status::InvalidArgument("request_rate is neither a number nor \"inf\"");
}

// Order of the latency columns: metric, then statistic (mean, median, std, percentiles).
std::pair<int, double> MsColumnOrder(const std::string& key) {
  static const char* kMetrics[] = {"ttft", "tpot", "itl", "e2el"};
  int metric = 4;
  for (int i = 0; i < 4; ++i) {
    if (key.find(std::string("_") + kMetrics[i] + "_ms") != std::string::npos) metric = i;
  }
  double stat = 1000;
  if (key.rfind("mean_", 0) == 0) stat = -3;
  if (key.rfind("median_", 0) == 0) stat = -2;
  if (key.rfind("std_", 0) == 0) stat = -1;
  if (key[0] == 'p') stat = std::strtod(key.c_str() + 1, nullptr);
  return {metric, stat};
}

std::string CsvCell(const json& v) {
  if (v.is_null()) return "";
  if (v.is_string()) {
    std::string s = v.get<std::string>();
    if (s.find_first_of(",\"\n") == std::string::npos) return s;
    std::string quoted = "\"";
    for (char c : s) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
    return quoted + "\"";
  }
  if (v.is_number_float()) return fmt::format("{:.6g}", v.get<double>());
  return v.dump();
}

}  // namespace

Result<SweepDeployment> ParseDeployment(const std::string& text) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos) {
    return Status::InvalidArgument("--deployment must be NAME=BASE_URL, got '" + text + "'");
  }
  SweepDeployment d{text.substr(0, eq), text.substr(eq + 1)};
  if (!ValidName(d.name)) {
    return Status::InvalidArgument("--deployment name '" + d.name +
                                   "' must be letters, digits, '.', '_' or '-'");
  }
  PD_RETURN_IF_ERROR(ParseBaseUrl(d.base_url).status());
  return d;
}

Result<std::vector<double>> ParseRates(const std::string& text) {
  std::vector<double> rates;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    double rate = 0;
    if (item == "inf") {
      rate = kInf;
    } else {
      char* end = nullptr;
      rate = std::strtod(item.c_str(), &end);
      if (item.empty() || end != item.c_str() + item.size() || !std::isfinite(rate) || rate <= 0) {
        return Status::InvalidArgument("--rates: '" + item + "' is not a positive rate or inf");
      }
    }
    if (std::find(rates.begin(), rates.end(), rate) != rates.end()) {
      return Status::InvalidArgument("--rates: " + item + " given twice");
    }
    rates.push_back(rate);
  }
  if (rates.empty()) return Status::InvalidArgument("--rates: no rate given");
  std::sort(rates.begin(), rates.end());
  return rates;
}

std::string RateLabel(double rate) { return std::isinf(rate) ? "inf" : fmt::format("{:g}", rate); }

Result<std::vector<SweepRun>> RunServeSweep(const SweepOptions& options) {
  if (options.deployments.empty()) return Status::InvalidArgument("no --deployment given");
  if (options.rates.empty()) return Status::InvalidArgument("no --rates given");
  if (options.result_dir.empty()) return Status::InvalidArgument("--result-dir is required");
  std::set<std::string> names;
  for (const SweepDeployment& d : options.deployments) {
    if (!names.insert(d.name).second) {
      return Status::InvalidArgument("--deployment " + d.name + " given twice");
    }
  }
  const int per_rate = options.dataset.random.num_prompts;
  if (per_rate < 1) return Status::InvalidArgument("--num-prompts must be >= 1");

  // One dataset for the whole sweep, sliced by rate.
  ServeDatasetOptions dataset = options.dataset;
  dataset.random.num_prompts = per_rate * static_cast<int>(options.rates.size());
  PD_ASSIGN_OR_RETURN(
      std::vector<SampleRequest> all,
      LoadServeDataset(dataset, options.deployments.front().base_url, options.bench.model));

  const fs::path runs_dir = fs::path(options.result_dir) / "runs";
  std::error_code ec;
  fs::create_directories(runs_dir, ec);
  if (ec) return Status::IoError("cannot create " + runs_dir.string() + ": " + ec.message());

  std::vector<SweepRun> runs;
  for (const SweepDeployment& d : options.deployments) {
    for (size_t i = 0; i < options.rates.size(); ++i) {
      const double rate = options.rates[i];
      ServeBenchOptions bench = options.bench;
      bench.base_url = d.base_url;
      bench.arrivals.request_rate = rate;
      bench.result_file.clear();
      const std::vector<SampleRequest> slice(all.begin() + static_cast<long>(i) * per_rate,
                                             all.begin() + static_cast<long>(i + 1) * per_rate);
      if (bench.print_table || bench.progress) {
        std::cout << fmt::format("== deployment {} ({}), request rate {} ==\n", d.name, d.base_url,
                                 RateLabel(rate))
                  << std::flush;
      }
      PD_ASSIGN_OR_RETURN(ServeBenchResult result, RunServeBench(bench, slice));
      SweepRun run{d.name, rate, std::move(result.json)};
      run.result["deployment"] = d.name;
      run.result["base_url"] = d.base_url;
      PD_RETURN_IF_ERROR(WriteTextFile(runs_dir / (d.name + "_rate-" + RateLabel(rate) + ".json"),
                                       run.result.dump() + "\n"));
      runs.push_back(std::move(run));
    }
  }
  return runs;
}

Result<std::vector<SweepRun>> LoadSweepRuns(const std::string& result_dir) {
  const fs::path runs_dir = fs::path(result_dir) / "runs";
  std::error_code ec;
  if (!fs::is_directory(runs_dir, ec)) {
    return Status::NotFound(runs_dir.string() + " does not exist: no sweep was run there");
  }
  std::vector<SweepRun> runs;
  for (const fs::directory_entry& e : fs::directory_iterator(runs_dir, ec)) {
    if (e.path().extension() != ".json") continue;
    std::ifstream in(e.path());
    json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
    const std::string file = e.path().string();
    if (j.is_discarded() || !j.is_object()) {
      return Status::InvalidArgument(file + ": not JSON");
    }
    if (!j.contains("deployment") || !j["deployment"].is_string() || !j.contains("request_rate")) {
      return Status::InvalidArgument(file + ": no deployment or request_rate: not a sweep run");
    }
    auto rate = RateFromJson(j["request_rate"]);
    if (!rate.ok()) return rate.status().WithContext(file);
    runs.push_back(SweepRun{j["deployment"].get<std::string>(), *rate, std::move(j)});
  }
  if (ec) return Status::IoError("cannot list " + runs_dir.string() + ": " + ec.message());
  std::sort(runs.begin(), runs.end(), [](const SweepRun& a, const SweepRun& b) {
    return a.deployment != b.deployment ? a.deployment < b.deployment : a.rate < b.rate;
  });
  return runs;
}

std::vector<std::string> SweepCsvColumns(const std::vector<SweepRun>& runs) {
  std::vector<std::string> columns = {"deployment",
                                      "request_rate",
                                      "num_prompts",
                                      "completed",
                                      "failed",
                                      "duration",
                                      "request_throughput",
                                      "request_goodput",
                                      "output_throughput",
                                      "total_token_throughput"};
  std::vector<std::string> ms;
  for (const SweepRun& run : runs) {
    for (const auto& [key, value] : run.result.items()) {
      if (value.is_number() && key.size() > 3 && key.compare(key.size() - 3, 3, "_ms") == 0 &&
          std::find(ms.begin(), ms.end(), key) == ms.end()) {
        ms.push_back(key);
      }
    }
  }
  std::sort(ms.begin(), ms.end(), [](const std::string& a, const std::string& b) {
    return MsColumnOrder(a) < MsColumnOrder(b);
  });
  columns.insert(columns.end(), ms.begin(), ms.end());
  return columns;
}

Status WriteTextFile(const fs::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  if (!out.flush()) return Status::IoError("cannot write " + path.string());
  return Status::Ok();
}

Status WriteSweepSummary(const std::vector<SweepRun>& runs, const std::string& result_dir) {
  json summary = json::array();
  for (const SweepRun& run : runs) {
    json row = json::object();
    for (const auto& [key, value] : run.result.items()) {
      if (!value.is_array() && !value.is_object()) row[key] = value;  // per-request lists stay
    }
    row["run_file"] = "runs/" + run.deployment + "_rate-" + RateLabel(run.rate) + ".json";
    summary.push_back(std::move(row));
  }
  PD_RETURN_IF_ERROR(
      WriteTextFile(fs::path(result_dir) / "sweep.json", json{{"runs", summary}}.dump(2) + "\n"));

  const std::vector<std::string> columns = SweepCsvColumns(runs);
  std::string csv;
  for (size_t c = 0; c < columns.size(); ++c) csv += (c ? "," : "") + columns[c];
  csv += "\n";
  for (const json& row : summary) {
    for (size_t c = 0; c < columns.size(); ++c) {
      if (c) csv += ",";
      if (row.contains(columns[c])) csv += CsvCell(row[columns[c]]);
    }
    csv += "\n";
  }
  return WriteTextFile(fs::path(result_dir) / "sweep.csv", csv);
}

}  // namespace pdserve::bench
