#pragma once
// `apiary bench tokenizer|loader|prepare`: the data layer's benchmarks. The
// `bench` verb (bench_cmd.cc) owns the subcommand and calls this to add them.

#include <CLI/CLI.hpp>
#include <string>

namespace apiary::cli {

void add_bench_data_commands(CLI::App* bench);

// The CPU's model name as lscpu shows it (/proc/cpuinfo "model name"), or
// "unknown": the machines this runs on differ in CPU, so every figure a
// benchmark prints carries it.
std::string cpu_model_name();

}  // namespace apiary::cli
