// plan calibrate on SYNTHETIC run directories: the test writes config.toml and
// metrics.jsonl in the trainer's format, with step times generated from known
// constants (plus noise), and checks that calibration recovers predictions
// within 10%. Real recorded runs of the trainer: layouts_test.cc.

#include "plan/calibrate.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "core/error.h"
#include "plan/step_time.h"
#include "test_util.h"

namespace apiary::plan {
namespace {

namespace fs = std::filesystem;

struct TempDir {
    fs::path path;
    TempDir() {
        path = fs::temp_directory_path() /
               ("apiary_plan_cal_" +
                std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(path);
        fs::create_directories(path);
    }
    ~TempDir() { fs::remove_all(path); }
};

// A synthetic run: the trainer's config keys (including ones the planner
// does not know) and metrics lines with eval lines mixed in.
void write_run(const fs::path& dir, const std::string& toml, double step_s, int world,
               unsigned seed) {
    fs::create_directories(dir);
    std::ofstream(dir / "config.toml") << toml << "\n[optim]\nlr = 0.001\n[data]\npath = \"x\"\n";
    std::ofstream m(dir / "metrics.jsonl");
    std::mt19937 rng(seed);
    std::normal_distribution<double> noise(0.0, 0.02);
    for (int s = 1; s <= 30; ++s) {
        const double t = (s <= 2 ? 3.0 : 1.0) * step_s * (1 + noise(rng));  // warm-up steps
        m << "{\"step\": " << s << ", \"loss\": 3.1, \"lr\": 0.001, \"step_time_s\": " << t
          << ", \"tokens_per_s\": 1000, \"mfu\": 0.3, \"world_size\": " << world << "}\n";
        if (s % 10 == 0) m << "{\"step\": " << s << ", \"eval_loss\": 3.0}\n";
    }
}

TEST(PlanCalibrate, RecoversSyntheticConstants) {
    TempDir tmp;
    // "True" machine: slower GEMMs and a slower link than the catalog says.
    const struct {
        const char* name;
        const char* toml;
        int world;
    } shapes[] = {
        {"r1", "[model]\npreset = \"tiny\"\n[train]\nbatch_size = 8\nseq_len = 256\n", 1},
        {"r2", "[model]\npreset = \"gpt2-124m\"\n[train]\nbatch_size = 2\nseq_len = 128\n", 1},
        {"r3", "[model]\npreset = \"tiny\"\n[train]\nbatch_size = 4\nseq_len = 128\n", 1},
        {"r4", "[model]\npreset = \"tiny\"\n[train]\nbatch_size = 8\nseq_len = 256\n", 2},
        {"r5",
         "[model]\npreset = \"tiny\"\n[train]\nbatch_size = 8\nseq_len = 256\n[parallel]\ntp = 2\n",
         4},
        {"r6", "[model]\npreset = \"gpt2-124m\"\n[train]\nbatch_size = 2\nseq_len = 128\n", 4},
    };
    std::vector<RunRecord> runs;
    std::vector<double> truth;
    unsigned seed = 1;
    for (const auto& s : shapes) {
        // Read once to get the shape, then synthesise its "measured" time.
        const fs::path dir = tmp.path / s.name;
        write_run(dir, s.toml, 1.0, s.world, seed);
        RunRecord r = read_run(dir.string(), test::schema(), "");
        Cluster c = r.in.c;
        c.dev.gemm_eff = 0.45, c.dev.mem_eff = 0.5;
        c.intra.bw = 2e9, c.intra.efficiency = 1, c.intra.latency = 20e-6;
        const double t = step_time(r.in.w, r.in.l, c).total;
        write_run(dir, s.toml, t, s.world, seed++);
        runs.push_back(read_run(dir.string(), test::schema(), ""));
        truth.push_back(t);
        EXPECT_EQ(runs.back().world_size, s.world);
    }
    const Calibration cal = calibrate(runs);
    EXPECT_EQ(cal.device, "epyc-zen5-2c");
    EXPECT_GT(cal.rms_rel_err_before, 0.10);  // the catalog is off for this "machine"
    EXPECT_LT(cal.rms_rel_err_after, 0.05);
    for (const auto& row : cal.rows) {
        EXPECT_NEAR(row.after_s / row.measured_s, 1.0, 0.10) << row.dir;
    }
    EXPECT_NEAR(cal.gemm_eff / 0.45, 1.0, 0.15);

    // Round trip through the file, then the planner reads it.
    const std::string file = (tmp.path / "cal.toml").string();
    write_calibration(cal, file);
    const Calibration back = read_calibration(file);
    EXPECT_NEAR(back.gemm_eff, cal.gemm_eff, 1e-5 * cal.gemm_eff);
    const PlanInput in = test::input({"model.preset=tiny", "train.batch_size=8",
                                      "train.seq_len=256", "plan.calibration=" + file});
    EXPECT_NEAR(step_time(in.w, in.l, in.c).total / truth[0], 1.0, 0.10);
}

TEST(PlanCalibrate, BadRunDirectoriesSayWhat) {
    TempDir tmp;
    EXPECT_THROW(read_run((tmp.path / "missing").string(), test::schema(), ""), IoError);
    const fs::path dir = tmp.path / "bad";
    fs::create_directories(dir);
    std::ofstream(dir / "config.toml") << "[model]\npreset = \"tiny\"\n";
    { std::ofstream(dir / "metrics.jsonl") << "{\"step\": 1, \"eval_loss\": 2}\n"; }
    EXPECT_THROW(read_run(dir.string(), test::schema(), ""), DataError);
    { std::ofstream(dir / "metrics.jsonl") << "{\"step\": 1, \"step_time_s\": 0.5}\n{oops\n"; }
    try {
        read_run(dir.string(), test::schema(), "");
        FAIL();
    } catch (const DataError& e) {
        EXPECT_NE(std::string(e.what()).find(":2:"), std::string::npos) << e.what();
    }
    // A calibration for another device is refused.
    Calibration cal;
    cal.device = "H100-SXM";
    cal.gemm_eff = 0.5;
    PlanInput in = test::input({"cluster.device=A100-80GB"});
    EXPECT_THROW(apply_calibration(cal, in.c), ConfigError);
}

TEST(PlanCalibrate, RunsAreTheTrainersWithItsVocabulary) {
    TempDir tmp;
    // model.vocab_size = 0: the trainer used its tokenizer's, as the run's
    // tokenizer.json (Hugging Face format) records it.
    const fs::path dir = tmp.path / "run";
    write_run(dir,
              "[model]\npreset = \"tiny\"\nvocab_size = 0\n[cluster]\n"
              "implementation = \"megatron\"\n[parallel]\nschedule = \"interleaved\"\npp = 2\n"
              "virtual_stages = 2\n[train]\ngrad_accum = 4\n",
              0.5, 2, 1);
    {
        std::ofstream(dir / "tokenizer.json")
            << R"({"version": "3", "added_tokens": [{"id": 300, "content": "<|endoftext|>"}],)"
            << R"( "model": {"type": "BPE", "vocab": {"a": 0, "b": 299, "ab": 17}}})";
    }
    const RunRecord r = read_run(dir.string(), test::schema(), "");
    EXPECT_EQ(r.in.w.model.vocab_size, 301);
    EXPECT_EQ(r.in.c.impl, Impl::apiary);  // whatever the run's config says
    EXPECT_EQ(r.in.l.vpp, 2);
    EXPECT_EQ(r.in.l.n_micro, 4);
    { std::ofstream(dir / "tokenizer.json") << R"({"model": {"vocab": {}}})"; }
    EXPECT_THROW(read_run(dir.string(), test::schema(), ""), DataError);
    { std::ofstream(dir / "tokenizer.json") << "{oops"; }
    EXPECT_THROW(read_run(dir.string(), test::schema(), ""), DataError);
    fs::remove(dir / "tokenizer.json");  // none: the preset's vocabulary
    EXPECT_EQ(read_run(dir.string(), test::schema(), "").in.w.model.vocab_size,
              core::preset("tiny").vocab_size);
}

}  // namespace
}  // namespace apiary::plan
