// The pdserve binary: every process role and tool is a subcommand.
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "common/logging.h"

int main(int argc, char** argv) {
  pdserve::InitLogging();
  CLI::App app{"pdserve: disaggregated prefill/decode LLM serving"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every subcommand");
  int exit_code = 0;
  pdserve::cli::AddGenerateCommand(app, &exit_code);
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks that print tables with ceilings");
  bench->require_subcommand(1);
  // Each command file adds its registration call here (see commands.h).
  pdserve::cli::AddBenchEngineCommand(*bench, &exit_code);
  pdserve::cli::AddBenchQualityCommand(*bench, &exit_code);
  pdserve::cli::AddBenchFabricCommand(*bench, &exit_code);
  pdserve::cli::AddBenchServeCommand(*bench, &exit_code);
  pdserve::cli::AddBenchSweepCommand(*bench, &exit_code);
  pdserve::cli::AddBenchSoakCommand(*bench, &exit_code);
  pdserve::cli::AddBenchDisaggCommand(*bench, &exit_code);
  pdserve::cli::AddBenchSpecCommand(*bench, &exit_code);
  pdserve::cli::AddTokenizeCommand(app, &exit_code);
  pdserve::cli::AddMakeModelCommand(app, &exit_code);
  pdserve::cli::AddRouterCommand(app, &exit_code);
  pdserve::cli::AddUpCommand(app, &exit_code);
  pdserve::cli::AddServeCommand(app, &exit_code);
  pdserve::cli::AddRankWorkerCommand(app, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return exit_code;
}
