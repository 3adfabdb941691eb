// Runs the built `apiary plan` binary: JSON fields, search output, config
// files and the error messages users see.

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace {

namespace fs = std::filesystem;

struct Result {
    int code;
    std::string out;
};

Result run(const std::string& args) {
    const std::string cmd = std::string(APIARY_BINARY_DIR) + "/apiary " + args + " 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return {-1, ""};
    std::string out;
    std::array<char, 4096> buf;
    while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
    const int status = pclose(p);
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(PlanCli, JsonHasEveryField) {
    const Result r =
        run("plan --model gpt3-175b --gpus 1024xA100-80GB --tokens 300e9 "
            "--global-batch 1536 --set parallel.tp=8 --set parallel.pp=16 "
            "--set train.batch_size=1 --set train.seq_len=2048 "
            "--set train.precision=bf16 --set parallel.recompute=full --json");
    ASSERT_EQ(r.code, 0) << r.out;
    const auto j = nlohmann::json::parse(r.out);
    for (const char* k : {"params", "grads", "optimizer", "activations", "buffers", "total"}) {
        EXPECT_TRUE(j["memory_gib"].contains(k)) << k;
    }
    for (const char* k :
         {"step_time_s", "step_time_breakdown_s", "tokens_per_s", "tflops_per_device", "mfu", "hfu",
          "time_to_train_days", "gpu_hours", "energy_kwh", "co2e_t", "cost_usd", "fits"}) {
        EXPECT_TRUE(j.contains(k)) << k;
    }
    EXPECT_TRUE(j["fits"].get<bool>());
    EXPECT_FALSE(j.contains("why"));
    EXPECT_EQ(j["layout"]["dp"], 8);
    EXPECT_EQ(j["global_batch"], 1536);
    EXPECT_GT(j["time_to_train_days"].get<double>(), 20);
    EXPECT_LT(j["time_to_train_days"].get<double>(), 50);
}

TEST(PlanCli, DoesNotFitSaysWhyAndSuggests) {
    const Result r =
        run("plan --model gpt3-13b --gpus 8xA100-80GB --set train.batch_size=1 "
            "--set train.seq_len=2048 --set train.precision=bf16 --json");
    ASSERT_EQ(r.code, 0) << r.out;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_FALSE(j["fits"].get<bool>());
    const std::string why = j["why"];
    EXPECT_NE(why.find("GiB"), std::string::npos) << why;
    EXPECT_NE(why.find("a layout that fits"), std::string::npos) << why;
}

TEST(PlanCli, TableOutput) {
    const Result r = run("plan --model gpt2-124m --gpus 8xH100-SXM --tokens 1e10");
    ASSERT_EQ(r.code, 0) << r.out;
    for (const char* s : {"memory per device", "step time", "MFU", "time to train", "emissions"}) {
        EXPECT_NE(r.out.find(s), std::string::npos) << s;
    }
}

TEST(PlanCli, ConfigFileSharedWithTheTrainer) {
    const fs::path dir = fs::temp_directory_path() / "apiary_plan_cli_cfg";
    fs::create_directories(dir);
    const fs::path f = dir / "run.toml";
    std::ofstream(f) << "[model]\npreset = \"gpt2-350m\"\n"
                        "[train]\nbatch_size = 4\nseq_len = 1024\ngrad_accum = 2\n"
                        "precision = \"bf16\"\n"
                        "[parallel]\ntp = 2\n"
                        "[cluster]\ndevice = \"A100-40GB\"\ngpus = 16\n";
    const Result r = run("plan --config " + f.string() + " --json");
    // A separate cluster file overrides the run's [cluster] table.
    const fs::path cl = dir / "cluster.toml";
    std::ofstream(cl) << "[cluster]\ndevice = \"H100-SXM\"\ntopology = \"dragonfly+\"\n";
    const Result r2 = run("plan --config " + f.string() + " --cluster " + cl.string() + " --json");
    fs::remove_all(dir);
    ASSERT_EQ(r2.code, 0) << r2.out;
    const auto j2 = nlohmann::json::parse(r2.out);
    EXPECT_EQ(j2["cluster"]["device"], "H100-SXM");
    EXPECT_EQ(j2["cluster"]["topology"], "dragonfly+");
    EXPECT_EQ(j2["cluster"]["devices"], 16);
    ASSERT_EQ(r.code, 0) << r.out;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["cluster"]["device"], "A100-40GB");
    EXPECT_EQ(j["layout"]["dp"], 8);
    // global batch = batch_size x grad_accum x dp
    EXPECT_EQ(j["global_batch"], 4 * 2 * 8);
}

TEST(PlanCli, SearchJson) {
    const Result r =
        run("plan search --model gpt3-6.7b --gpus 64xA100-80GB --global-batch 256 "
            "--set train.seq_len=2048 --set train.precision=bf16 --top 3 --json");
    ASSERT_EQ(r.code, 0) << r.out;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["best"].size(), 3u);
    EXPECT_TRUE(j["dropped"].contains("out of memory"));
    EXPECT_GT(j["candidates"].get<long long>(), j["fitting"].get<long long>());
}

TEST(PlanCli, ErrorsNameTheProblem) {
    Result r = run("plan --gpus 8xZ100");
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.out.find("unknown device 'Z100'"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("H100-SXM"), std::string::npos) << r.out;  // lists the known ones

    r = run("plan --model gpt5");
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.out.find("gpt3-175b"), std::string::npos) << r.out;

    r = run("plan --model gpt3-175b --gpus 80xA100-80GB --set parallel.tp=5");
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.out.find("does not divide model.n_head = 96"), std::string::npos) << r.out;

    r =
        run("plan search --model llama3-405b --gpus 8xA100-40GB --global-batch 8 "
            "--set train.seq_len=8192 --set train.precision=bf16");
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.out.find("fit no layout"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("devices"), std::string::npos) << r.out;
}

TEST(PlanCli, CarbonProfileFile) {
    const fs::path dir = fs::temp_directory_path() / "apiary_plan_cli_co2";
    fs::create_directories(dir);
    // A day with a clean afternoon: the best start lands in it.
    std::ofstream(dir / "grid.txt") << "# gCO2e/kWh per hour\n"
                                    << "500\n500\n500\n500\n500\n500\n500\n500\n500\n500\n"
                                    << "500\n500\n50\n50\n50\n50\n500\n500\n500\n500\n"
                                    << "500\n500\n500\n500\n";
    std::ofstream(dir / "bad.txt") << "400\nlots\n";
    const std::string base =
        "plan --model gpt2-124m --gpus 8xA100-80GB --tokens 5e8 --json "
        "--set cluster.carbon_profile=";
    const Result r = run(base + (dir / "grid.txt").string());
    const Result bad = run(base + (dir / "bad.txt").string());
    const Result missing = run(base + (dir / "none.txt").string());
    fs::remove_all(dir);
    ASSERT_EQ(r.code, 0) << r.out;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_GE(j["best_start_hour"].get<double>(), 8);
    EXPECT_LE(j["best_start_hour"].get<double>(), 15);
    EXPECT_LT(j["best_co2e_t"].get<double>(), j["co2e_t"].get<double>());
    EXPECT_EQ(bad.code, 1);
    EXPECT_NE(bad.out.find("bad.txt:2"), std::string::npos) << bad.out;
    EXPECT_EQ(missing.code, 1);
    EXPECT_NE(missing.out.find("cannot read"), std::string::npos) << missing.out;
}

// SYNTHETIC run directories in the trainer's format (config.toml with keys
// the planner does not know, metrics.jsonl with eval lines mixed in).
TEST(PlanCli, CalibrateWritesAFileThePlannerReads) {
    const fs::path dir = fs::temp_directory_path() / "apiary_plan_cli_cal";
    fs::remove_all(dir);
    for (int w : {1, 2}) {
        const fs::path run_dir = dir / ("run" + std::to_string(w));
        fs::create_directories(run_dir);
        std::ofstream(run_dir / "config.toml")
            << "[model]\npreset = \"tiny\"\n[train]\nbatch_size = 8\nseq_len = 256\n"
            << "[optim]\nlr = 0.001\n";
        std::ofstream m(run_dir / "metrics.jsonl");
        for (int s = 1; s <= 12; ++s) {
            m << "{\"step\": " << s
              << ", \"loss\": 3.0, \"lr\": 0.001, \"step_time_s\": " << 0.2 * w
              << ", \"tokens_per_s\": 1, \"mfu\": 0.2, \"world_size\": " << w << "}\n";
        }
        m << "{\"step\": 12, \"eval_loss\": 2.9}\n";
    }
    const std::string out = (dir / "cal.toml").string();
    const Result r = run("plan calibrate " + (dir / "run1").string() + " " +
                         (dir / "run2").string() + " --out " + out);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("rms relative error"), std::string::npos) << r.out;
    const Result p =
        run("plan --set model.preset=tiny --set train.batch_size=8 "
            "--set train.seq_len=256 --calibration " +
            out + " --json");
    ASSERT_EQ(p.code, 0) << p.out;
    const double t = nlohmann::json::parse(p.out)["step_time_s"].get<double>();
    EXPECT_NEAR(t / 0.2, 1.0, 0.10);  // one run, one constant: it fits that run
    const Result other = run("plan --gpus 8xA100-80GB --calibration " + out);
    EXPECT_EQ(other.code, 1);
    EXPECT_NE(other.out.find("is for device 'epyc-zen5-2c'"), std::string::npos) << other.out;
    const Result empty = run("plan calibrate " + dir.string());
    EXPECT_EQ(empty.code, 1);
    EXPECT_NE(empty.out.find("config.toml"), std::string::npos) << empty.out;
    fs::remove_all(dir);
}

TEST(PlanCli, DevicesListsTheCatalog) {
    const Result r = run("plan devices");
    ASSERT_EQ(r.code, 0) << r.out;
    for (const char* d : {"A100-40GB", "A100-80GB", "H100-SXM", "H100-PCIe", "H200", "B200",
                          "MI300X", "TPUv4", "TPUv5p", "epyc-zen5-2c", "dragonfly+"}) {
        EXPECT_NE(r.out.find(d), std::string::npos) << d;
    }
}

}  // namespace

// A run whose nodes fail faster than it can checkpoint never finishes: a
// warning in the table and the JSON, and no number for its time or cost.
TEST(PlanCli, GoodputZeroIsAWarningNotANumber) {
    const std::string args =
        "plan --model gpt3-1.3b --gpus 64xH100-SXM --tokens 1e12 --global-batch 512 "
        "--set train.seq_len=2048 --set train.precision=bf16 --set train.batch_size=1 "
        "--set cluster.mtbf_node_hours=0.01";
    const Result t = run(args);
    ASSERT_EQ(t.code, 0) << t.out;
    EXPECT_NE(t.out.find("warning: goodput is 0"), std::string::npos) << t.out;
    EXPECT_EQ(t.out.find("inf"), std::string::npos) << t.out;
    const Result j = run(args + " --json");
    ASSERT_EQ(j.code, 0) << j.out;
    const auto o = nlohmann::json::parse(j.out);
    EXPECT_TRUE(o["time_to_train_days"].is_null());
    EXPECT_TRUE(o["cost_usd"].is_null());
    ASSERT_FALSE(o["warnings"].empty());
}

TEST(PlanCli, InconsistentLayoutsAreErrors) {
    Result r = run("plan --model gpt3-1.3b --gpus 8xA100-80GB --set train.seq_len=4096");
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.out.find("model.max_seq_len = 2048"), std::string::npos) << r.out;
    r = run("plan --model gpt3-1.3b --gpus 8xA100-80GB --set parallel.schedule=interleaved");
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.out.find("needs parallel.pp > 1"), std::string::npos) << r.out;
    r = run("plan --model gpt3-1.3b --gpus 8xA100-80GB --set parallel.ep=2");
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.out.find("no experts"), std::string::npos) << r.out;
    // Keys the planner ignores are named in a warning, in both outputs.
    r =
        run("plan --model gpt3-1.3b --gpus 8xA100-80GB --set parallel.sequence_parallel=true "
            "--json");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(nlohmann::json::parse(r.out)["warnings"].dump().find("sequence_parallel"),
              std::string::npos);
}

TEST(PlanCli, ValidatePrintsBothSplits) {
    const Result r =
        run(std::string("plan validate ") + APIARY_SOURCE_DIR + "/tests/plan/validation.toml");
    ASSERT_EQ(r.code, 0) << r.out;
    for (const char* s : {"throughput", "iteration time", "fit", "holdout", "p90"}) {
        EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
    }
    const Result j = run(std::string("plan validate --json ") + APIARY_SOURCE_DIR +
                         "/tests/plan/validation.toml");
    ASSERT_EQ(j.code, 0) << j.out;
    EXPECT_GE(nlohmann::json::parse(j.out)["runs"].get<int>(), 60);
}

// Mixture of experts and context parallelism in `plan` and `plan search`.
TEST(PlanCli, ExpertsAndContextParallelism) {
    const std::string model =
        "--set model.preset=llama3-8b --set model.n_expert=64 --set model.n_expert_active=4 "
        "--set model.moe_ffn_hidden=1024 --set model.max_seq_len=32768 "
        "--set train.seq_len=32768 --set train.precision=fp8 --set train.batch_size=1 ";
    Result r = run("plan --gpus 64xH100-SXM --global-batch 64 " + model +
                   "--set parallel.cp=4 --set parallel.ep=8 --json");
    ASSERT_EQ(r.code, 0) << r.out;
    auto o = nlohmann::json::parse(r.out);
    EXPECT_EQ(o["layout"]["cp"], 4);
    EXPECT_EQ(o["layout"]["ep"], 8);
    EXPECT_GT(o["step_time_breakdown_s"]["ep_comm"].get<double>(), 0);
    r = run("plan search --gpus 64xH100-SXM --global-batch 64 " + model + "--top 3 --json");
    ASSERT_EQ(r.code, 0) << r.out;
    o = nlohmann::json::parse(r.out);
    EXPECT_GT(o["best"][0]["layout"]["cp"].get<int>() * o["best"][0]["layout"]["ep"].get<int>(), 1);
}

namespace {

// The flags are checked as the keys they stand for: a value that --set
// refuses is refused by the flag too, never silently replaced by a default.
TEST(PlanCli, FlagsAreValidatedAsTheirKeys) {
    const struct {
        const char* flag;
        const char* key;
    } cases[] = {{"--tokens -1e9", "plan.tokens=-1e9"},
                 {"--tokens nan", "plan.tokens=nan"},
                 {"--global-batch -5", "plan.global_batch=-5"}};
    for (const auto& c : cases) {
        SCOPED_TRACE(c.flag);
        const Result flag = run(std::string("plan --model gpt3-1.3b ") + c.flag);
        const Result set = run(std::string("plan --model gpt3-1.3b --set ") + c.key);
        EXPECT_NE(set.code, 0) << set.out;
        EXPECT_EQ(flag.code, set.code) << flag.out;
        const std::string key = std::string(c.key).substr(0, std::string(c.key).find('='));
        EXPECT_NE(flag.out.find(std::string(c.flag) + ": " + key + " = "), std::string::npos)
            << flag.out;
    }
}

TEST(PlanCli, SearchTopBelowOneIsRefused) {
    const Result r = run("plan search --model gpt3-1.3b --gpus 8xA100-80GB --top 0");
    EXPECT_NE(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("--top 0: the number of layouts to show must be at least 1"),
              std::string::npos)
        << r.out;
    EXPECT_EQ(r.out.find("fits"), std::string::npos) << r.out;
}

}  // namespace
