// Subcommands of the `pdserve` binary. Each Add*Command registers its flags on `app` and a
// callback that runs it; the callback stores the process exit code in *exit_code.
// Called once from main(), single-threaded.
#pragma once

#include <CLI/CLI.hpp>

namespace pdserve::cli {

void AddGenerateCommand(CLI::App& app, int* exit_code);
void AddTokenizeCommand(CLI::App& app, int* exit_code);
void AddMakeModelCommand(CLI::App& app, int* exit_code);
void AddRouterCommand(CLI::App& app, int* exit_code);
void AddUpCommand(CLI::App& app, int* exit_code);
void AddServeCommand(CLI::App& app, int* exit_code);
// Hidden: a node starts its tensor-parallel ranks with it.
void AddRankWorkerCommand(CLI::App& app, int* exit_code);
// `pdserve bench ...` has sub-subcommands; `bench` is the group they attach to.
void AddBenchEngineCommand(CLI::App& bench, int* exit_code);
void AddBenchQualityCommand(CLI::App& bench, int* exit_code);
void AddBenchFabricCommand(CLI::App& bench, int* exit_code);
void AddBenchServeCommand(CLI::App& bench, int* exit_code);
void AddBenchSweepCommand(CLI::App& bench, int* exit_code);
void AddBenchSoakCommand(CLI::App& bench, int* exit_code);
void AddBenchDisaggCommand(CLI::App& bench, int* exit_code);
void AddBenchSpecCommand(CLI::App& bench, int* exit_code);

}  // namespace pdserve::cli
