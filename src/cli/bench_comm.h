#pragma once
// `apiary bench comm`: added under the `apiary bench` verb by the file that
// defines that verb (so this file registers nothing itself).

namespace CLI {
class App;
}

namespace apiary::cli {

void add_bench_comm_command(CLI::App* bench);
// `apiary bench ddp` (bench_ddp_cmd.cc).
void add_bench_ddp_command(CLI::App* bench);
// `apiary bench ckpt` (bench_ckpt_cmd.cc).
void add_bench_ckpt_command(CLI::App* bench);
// `apiary bench obs` (bench_obs_cmd.cc).
void add_bench_obs_command(CLI::App* bench);

}  // namespace apiary::cli
