#pragma once
// `apiary bench tokenizer|loader|prepare`: the data layer's benchmarks. The
// `bench` verb (bench_cmd.cc) owns the subcommand and calls this to add them.

#include <CLI/CLI.hpp>

namespace apiary::cli {

void add_bench_data_commands(CLI::App* bench);

}  // namespace apiary::cli
