// Every model-parallel layout against the one-rank run with the same global
// batch, through the real engine (`mpirun -n N apiary train`), for GPT-2 and
// LLaMA with grouped-query attention: tensor, sequence and pipeline
// parallelism (1F1B, GPipe, interleaved), combined with data parallelism and
// ZeRO. Each layout's losses agree within 1e-5 relative over 10 fp32 steps,
// its gradient norms within 1e-4, and its parameters after the last step
// within 1e-4 of how far training moved them; bf16 within a tolerance an
// untrained model fails. The byte vocabulary (257 tokens) does not divide by
// the tensor-parallel sizes; one run pads it to 258, which does.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "layout_util.h"

using namespace apiary::testing;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Layout {
    std::string name;
    int ranks;
    std::string args;
};

class Layouts : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() /
               ("apiary_layouts_" + std::to_string(::getpid()) + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(dir_);
        fs::create_directories(dir_);
        runs_ = std::make_unique<LayoutRuns>(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }

    // Eight blocks, so that four stages of two virtual stages each divide
    // them; four heads (GPT-2) or eight heads over four KV groups (LLaMA).
    static std::string model_args(const std::string& arch) {
        if (arch == "gpt2") {
            return "--set model.preset=tiny --set model.n_layer=8 --set model.n_embd=128 "
                   "--set model.n_head=4 ";
        }
        return "--set model.preset=tiny-llama --set model.n_layer=8 --set model.n_embd=128 "
               "--set model.n_head=8 --set model.n_kv_head=4 ";
    }
    // Global batch 16 sequences of 64 bytes: dp x B x 4 micro-batches.
    std::string args(const std::string& arch, int dp, const std::string& extra) const {
        return model_args(arch) +
               "--set data.tokenizer=byte --set train.steps=10 "
               "--set train.seq_len=64 --set train.grad_accum=4 --set train.log_every=1 "
               "--set train.eval_every=5 --set train.eval_batches=2 --set train.threads=1 "
               "--set train.warmup_steps=3 --set train.lr=1e-3 "
               "--set train.batch_size=" +
               std::to_string(4 / dp) + " " + extra;
    }
    void run(const std::string& name, int ranks, int dp, const std::string& arch,
             const std::string& extra) {
        const auto r = runs_->run(name, ranks, args(arch, dp, extra));
        ASSERT_EQ(r.exit_code, 0) << name << ":\n" << r.output;
    }
    // The initial parameters: one step at learning rate 0.
    void init(const std::string& name, const std::string& arch, const std::string& extra = "") {
        run(name, 1, 1, arch,
            extra +
                " --set train.steps=1 --set train.lr=0 --set train.min_lr=0 "
                "--set train.warmup_steps=0");
    }
    void expect_same(const std::string& base, const std::string& init, const std::string& name,
                     double loss_tol, double norm_tol, double update_tol) {
        runs_->expect_series_near(base, name, "loss", 10, loss_tol);
        runs_->expect_series_near(base, name, "grad_norm", 10, norm_tol);
        const double d = runs_->update_difference(base, name, init, 10);
        EXPECT_LT(d, update_tol) << name << " vs " << base;
        std::printf("  %-28s parameters differ by %.2e of their movement\n", name.c_str(), d);
    }
    void check_layouts(const std::string& arch, const std::vector<Layout>& layouts) {
        run("base", 1, 1, arch, "");
        init("init", arch);
        for (const auto& l : layouts) {
            SCOPED_TRACE(l.name);
            const int dp = l.args.find("dp=2") != std::string::npos ? 2 : 1;
            run(l.name, l.ranks, dp, arch, l.args);
            expect_same("base", "init", l.name, 1e-5, 1e-4, 1e-4);
        }
    }

    fs::path dir_;
    std::unique_ptr<LayoutRuns> runs_;
};

const std::vector<Layout>& model_parallel_layouts() {
    static const std::vector<Layout> l = {
        {"tp2", 2, "--set parallel.tp=2"},
        {"tp4", 4, "--set parallel.tp=4"},
        {"pp2", 2, "--set parallel.pp=2"},
        {"pp4", 4, "--set parallel.pp=4"},
        {"tp2_dp2", 4, "--set parallel.tp=2 --set parallel.dp=2"},
        {"pp2_dp2", 4, "--set parallel.pp=2 --set parallel.dp=2 --set parallel.zero_stage=1"},
        {"tp2_pp2", 4, "--set parallel.tp=2 --set parallel.pp=2"},
        {"pp4_interleaved", 4,
         "--set parallel.pp=4 --set parallel.schedule=interleaved "
         "--set parallel.virtual_stages=2"},
        {"pp2_gpipe", 2, "--set parallel.pp=2 --set parallel.schedule=gpipe"},
        {"tp2_sp", 2, "--set parallel.tp=2 --set parallel.sequence_parallel=true"},
        {"tp2_zero3_dp2", 4, "--set parallel.tp=2 --set parallel.dp=2 --set parallel.zero_stage=3"},
    };
    return l;
}

}  // namespace

TEST_F(Layouts, Gpt2EveryLayoutMatchesOneRank) { check_layouts("gpt2", model_parallel_layouts()); }

TEST_F(Layouts, LlamaWithGqaEveryLayoutMatchesOneRank) {
    check_layouts("llama", model_parallel_layouts());
}

TEST_F(Layouts, VocabularyThatDividesMatchesToo) {
    // 258 rows (the byte tokenizer's 257 padded): 129 per tensor-parallel rank.
    const std::string pad = "--set model.vocab_size=258";
    run("base", 1, 1, "gpt2", pad);
    init("init", "gpt2", pad);
    run("tp2", 2, 1, "gpt2", pad + " --set parallel.tp=2");
    expect_same("base", "init", "tp2", 1e-5, 1e-4, 1e-4);
}

TEST_F(Layouts, Bf16LayoutsTrackOneRankWithinBf16Tolerance) {
    const std::string bf16 = "--set train.precision=bf16";
    run("base", 1, 1, "gpt2", bf16 + " --set train.ckpt_every=5");
    init("init", "gpt2", bf16);
    // The same bf16 roundings of differently summed fp32 values: the loss
    // within a quarter of bf16's resolution, the parameters within 5% of
    // their movement (an untrained run, or one on other data, is at 100%).
    for (const auto& [name, ranks, extra] : std::vector<Layout>{
             {"tp2_sp", 2, "--set parallel.tp=2 --set parallel.sequence_parallel=true"},
             {"pp2", 2, "--set parallel.pp=2"}}) {
        run(name, ranks, 1, "gpt2", bf16 + " " + extra);
        expect_same("base", "init", name, 2e-3, 2e-2, 5e-2);
    }
    // The tolerance is tight enough to fail a run that trained only half as
    // long (the base run at step 5): a fortiori one that did not train. An
    // untrained base fails this too (0 / 0 movement).
    const double half = runs_->update_difference("base", "base", "init", 10, 5);
    EXPECT_GT(half, 5e-2);
    std::printf("  %-28s parameters differ by %.2e of their movement\n", "base at step 5", half);
}

TEST_F(Layouts, RecomputeModesGiveTheSameGradients) {
    // The recomputed forward runs the same kernels on the same inputs: the
    // same gradients bit for bit, less activation memory kept.
    const std::string pp = "--set parallel.pp=2 ";
    int64_t previous = 0;
    for (const char* mode : {"none", "selective", "full"}) {
        run(mode, 2, 1, "gpt2", pp + "--set parallel.recompute=" + mode);
        EXPECT_EQ(runs_->series("none", "grad_norm"), runs_->series(mode, "grad_norm")) << mode;
        EXPECT_EQ(runs_->series("none", "loss"), runs_->series(mode, "loss")) << mode;
        EXPECT_EQ(runs_->params("none", 10), runs_->params(mode, 10)) << mode;
        int64_t activations = 0;
        for (const auto& j : runs_->metrics(mode)) {
            if (j.contains("memory_peak_bytes_per_rank")) {
                activations = j["memory_peak_bytes_per_rank"]["activations"].get<int64_t>();
            }
        }
        if (previous > 0) {
            EXPECT_LT(activations, previous) << mode;
        }
        previous = activations;
    }
    // Under tensor parallelism too (the recomputed block communicates again).
    run("tp_none", 2, 1, "llama", "--set parallel.tp=2");
    run("tp_full", 2, 1, "llama", "--set parallel.tp=2 --set parallel.recompute=full");
    EXPECT_EQ(runs_->series("tp_none", "grad_norm"), runs_->series("tp_full", "grad_norm"));
    EXPECT_EQ(runs_->params("tp_none", 10), runs_->params("tp_full", 10));
}

TEST_F(Layouts, MixtureOfExpertsDataParallelAndZeroMatchOneRank) {
    // Router statistics (capacity, the balance loss) are per micro-batch, so
    // the one-rank run takes the same micro-batches of 2 sequences as each
    // data-parallel rank: 8 of them per step against 4 on each of 2 ranks
    // (the loader hands rank r the r-th pair of each micro-step's draws).
    for (const auto& [arch, moe] : std::vector<std::pair<std::string, std::string>>{
             {"gpt2",
              "--set model.n_layer=3 --set model.n_expert=4 --set model.n_expert_active=2 "
              "--set model.moe_ffn_hidden=96 --set model.n_shared_expert=1 "
              "--set model.moe_dense_layers=1 --set model.moe_aux_loss_coef=0.1 "},
             {"llama",
              "--set model.n_layer=2 --set model.n_expert=3 --set model.n_expert_active=1 "
              "--set model.moe_ffn_hidden=64 --set model.moe_router=sigmoid "
              "--set model.moe_dropless=true --set model.moe_aux_loss_coef=0.1 "}}) {
        SCOPED_TRACE(arch);
        run(arch + "_base", 1, 2, arch, moe + "--set train.grad_accum=8");
        init(arch + "_init", arch, moe);
        for (const auto& [name, extra] : std::vector<std::pair<std::string, std::string>>{
                 {"dp2", "--set parallel.dp=2"},
                 {"dp2_zero1", "--set parallel.dp=2 --set parallel.zero_stage=1"},
                 {"dp2_zero3", "--set parallel.dp=2 --set parallel.zero_stage=3"}}) {
            run(arch + "_" + name, 2, 2, arch, moe + extra);
            expect_same(arch + "_base", arch + "_init", arch + "_" + name, 1e-5, 1e-4, 1e-4);
        }
        // The expert load is logged per block (metrics.jsonl).
        bool logged = false;
        for (const auto& j : runs_->metrics(arch + "_dp2_zero3")) {
            if (!j.contains("moe")) continue;
            logged = true;
            const auto& first = j["moe"][0];
            EXPECT_EQ(first["tokens"].size(), arch == "gpt2" ? 4u : 3u);
            EXPECT_GE(first["imbalance"].get<double>(), 1.0);
        }
        EXPECT_TRUE(logged);
    }
}

// Expert parallelism: ep ranks of the four data-parallel ones (of two, with
// two pipeline stages) share out the experts; the tokens travel by
// all-to-all. Every rank's micro-batch is one
// sequence, as is each of the one-rank run's 16 (the router's capacity and
// losses are per micro-batch).
const std::string& gpt2_moe() {
    static const std::string s =
        "--set model.n_layer=3 --set model.n_expert=4 --set model.n_expert_active=2 "
        "--set model.moe_ffn_hidden=96 --set model.n_shared_expert=1 "
        "--set model.moe_dense_layers=1 --set model.moe_aux_loss_coef=0.1 ";
    return s;
}

TEST_F(Layouts, ExpertParallelMatchesOneRank) {
    for (const auto& [arch, moe] : std::vector<std::pair<std::string, std::string>>{
             {"gpt2", gpt2_moe()},
             {"llama",
              "--set model.n_layer=2 --set model.n_expert=4 --set model.n_expert_active=1 "
              "--set model.moe_ffn_hidden=64 --set model.moe_router=sigmoid "
              "--set model.moe_dropless=true --set model.moe_aux_loss_coef=0.1 "}}) {
        SCOPED_TRACE(arch);
        run(arch + "_base", 1, 4, arch, moe + "--set train.grad_accum=16");
        init(arch + "_init", arch, moe);
        // ep x pp: two stages of dp 2 x ep 2, each rank still one sequence
        // per micro-batch (8 micro-batches a step).
        const std::string pp2 = "--set parallel.pp=2 --set parallel.dp=2 --set train.grad_accum=8 ";
        std::vector<std::pair<std::string, std::string>> layouts = {
            {"ep2", "--set parallel.ep=2"},
            {"ep4", "--set parallel.ep=4 --set profile.steps=2-2"},
            {"ep2_pp2", pp2 + "--set parallel.ep=2"},
            {"ep4_zero2", "--set parallel.ep=4 --set parallel.zero_stage=2"}};
        if (arch == "gpt2") {
            layouts.push_back({"ep1", "--set parallel.ep=1"});
            layouts.push_back({"ep2_zero1", "--set parallel.ep=2 --set parallel.zero_stage=1"});
            // The recomputed forward dispatches again: the same all-to-alls.
            layouts.push_back({"ep2_full", "--set parallel.ep=2 --set parallel.recompute=full"});
            layouts.push_back({"pp2", pp2});
        }
        for (const auto& [name, extra] : layouts) {
            run(arch + "_" + name, 4, 4, arch, moe + extra);
            expect_same(arch + "_base", arch + "_init", arch + "_" + name, 1e-5, 1e-4, 1e-4);
        }
    }
    // The all-to-alls happened and were timed apart: ep 4 logs their time,
    // and its trace has them as spans of their own.
    double ep4 = 0;
    for (const auto& j : runs_->metrics("gpt2_ep4")) ep4 += j.value("ep_comm_s", 0.0);
    EXPECT_GT(ep4, 0.0);
    std::ifstream trace(dir_ / "gpt2_ep4" / "trace" / "rank_00000.json");
    const std::string text((std::istreambuf_iterator<char>(trace)), {});
    EXPECT_NE(text.find("\"ep all-to-all\""), std::string::npos);
    EXPECT_NE(text.find("\"all_to_all_v\""), std::string::npos);
}

TEST_F(Layouts, MixtureOfExpertsInBf16TracksOneRankWithinBf16Tolerance) {
    // The attention and dense blocks in bf16, the MoE blocks' router and
    // experts in fp32: expert parallelism against one rank, within the bf16
    // layouts' tolerance (Bf16LayoutsTrackOneRankWithinBf16Tolerance).
    const std::string bf16 = gpt2_moe() + "--set train.precision=bf16 ";
    run("base", 1, 4, "gpt2", bf16 + "--set train.grad_accum=16 --set train.ckpt_every=5");
    init("init", "gpt2", bf16);
    for (const auto& [name, extra] : std::vector<std::pair<std::string, std::string>>{
             {"ep2", "--set parallel.ep=2"},
             {"ep4_zero1", "--set parallel.ep=4 --set parallel.zero_stage=1"}}) {
        run(name, 4, 4, "gpt2", bf16 + extra);
        expect_same("base", "init", name, 2e-3, 2e-2, 5e-2);
    }
    // Tight enough to fail a run that trained half as long.
    EXPECT_GT(runs_->update_difference("base", "base", "init", 10, 5), 5e-2);
    // And the model did run in bf16: the fp32 run's losses differ.
    run("fp32", 1, 4, "gpt2", gpt2_moe() + "--set train.grad_accum=16");
    EXPECT_NE(runs_->series("base", "loss"), runs_->series("fp32", "loss"));
}

TEST_F(Layouts, ExpertParallelCheckpointsStoreEachExpertOnceAndReshard) {
    // Routing without a capacity or router losses depends on each token
    // alone, so runs with other micro-batches (fewer ranks, more rows each)
    // end where the uninterrupted one does. ep 4 -> 2, 2 -> 1, 1 -> 2.
    const std::string moe = gpt2_moe() +
                            "--set model.moe_dropless=true --set model.moe_aux_loss_coef=0 "
                            "--set model.moe_z_loss_coef=0 --set train.ckpt_every=5 ";
    run("one", 1, 1, "gpt2", moe);
    init("init", "gpt2", moe);
    run("ep4", 4, 4, "gpt2", moe + "--set parallel.ep=4");
    run("ep2", 2, 2, "gpt2", moe + "--set parallel.ep=2");
    // Each expert tensor's parameters are in the ep 4 checkpoint once: the
    // pieces of its edp group, no rank repeating another's.
    const json manifest =
        json::parse(std::ifstream(dir_ / "ep4" / "ckpt" / "step_00000005" / "manifest.json"));
    std::map<std::string, int64_t> stored, numel;
    for (const auto& c : manifest["chunks"]) {
        if (c["kind"] != "param") continue;
        const std::string t = c["tensor"];
        stored[t] += c["count"].get<int64_t>();
        int64_t n = 1;
        for (const auto& d : c["placement"]["global_shape"]) n *= d.get<int64_t>();
        numel[t] = n;
    }
    ASSERT_TRUE(stored.count("h.1.mlp.experts.3.c_fc.weight"));
    for (const auto& [t, n] : stored) EXPECT_EQ(n, numel[t]) << t;
    // Resume each from step 5 on another ep (and rank count).
    for (const auto& [from, ranks, ep] : std::vector<std::tuple<std::string, int, int>>{
             {"ep4", 2, 2}, {"ep2", 1, 1}, {"one", 2, 2}}) {
        SCOPED_TRACE(from);
        const std::string to = from + "_to_ep" + std::to_string(ep);
        fs::copy(dir_ / from, dir_ / to, fs::copy_options::recursive);
        fs::remove_all(dir_ / to / "ckpt" / "step_00000010");
        std::ofstream(dir_ / to / "ckpt" / "latest", std::ios::trunc) << "step_00000005";
        const std::string launcher =
            ranks > 1 ? std::string(APIARY_MPIRUN) + " -n " + std::to_string(ranks) + " " : "";
        const auto r = run_command(
            launcher + apiary_bin() + " train --resume " + (dir_ / to).string() +
            " --set parallel.ep=" + std::to_string(ep) + " --set train.batch_size=" +
            std::to_string(4 / ranks) + " --set parallel.dp=" + std::to_string(ranks));
        ASSERT_EQ(r.exit_code, 0) << r.output;
        const double d = runs_->update_difference("one", to, "init", 10);
        EXPECT_LT(d, 1e-4) << to;
        std::printf("  %-28s parameters differ by %.2e of their movement\n", to.c_str(), d);
    }
}

TEST_F(Layouts, BadLayoutIsRefusedOnceBeforeAnyRankAllocates) {
    const auto r = runs_->run(
        "bad", 4,
        args("gpt2", 1, "--set parallel.tp=4 --set model.n_head=6 --set model.n_embd=192"));
    EXPECT_NE(r.exit_code, 0);
    // Every rank fails the same check before allocating; the message names
    // the numbers and what would work.
    EXPECT_NE(r.output.find("parallel.tp = 4 does not divide model.n_head = 6"), std::string::npos)
        << r.output;
    EXPECT_EQ(r.output.find("internal error"), std::string::npos) << r.output;
    const std::string error = "apiary: error:";
    EXPECT_EQ(r.output.find(error), r.output.rfind(error)) << "printed more than once:\n"
                                                           << r.output;
    EXPECT_FALSE(fs::exists(dir_ / "bad"));
}
