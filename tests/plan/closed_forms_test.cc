// Closed forms the planner must reproduce exactly: ZeRO model states, 6ND,
// the pipeline bubble, ring all-reduce, Korthikanti activations, Young/Daly,
// goodput and the carbon-aware start.

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "plan/collectives.h"
#include "plan/memory.h"
#include "plan/step_time.h"
#include "plan/totals.h"
#include "test_util.h"

namespace apiary::plan {
namespace {

using test::input;

// Rajbhandari et al. 2020 (ZeRO), Figure 1: a 7.5B model on 64 GPUs with mixed
// precision Adam (K = 12): 120 GB baseline, 31.4 GB with P_os, 16.6 GB with
// P_os+g, 1.9 GB with P_os+g+p.
TEST(PlanClosedForm, ZeroModelStatesMatchThePaper) {
    const double psi = 7.5e9;
    EXPECT_DOUBLE_EQ(zero_model_state_bytes(psi, 64, 0, Dtype::bf16), 16 * psi);
    EXPECT_DOUBLE_EQ(zero_model_state_bytes(psi, 64, 1, Dtype::bf16), 4 * psi + 12 * psi / 64);
    EXPECT_DOUBLE_EQ(zero_model_state_bytes(psi, 64, 2, Dtype::bf16), 2 * psi + 14 * psi / 64);
    EXPECT_DOUBLE_EQ(zero_model_state_bytes(psi, 64, 3, Dtype::bf16), 16 * psi / 64);
    EXPECT_NEAR(zero_model_state_bytes(psi, 64, 0, Dtype::bf16) / 1e9, 120.0, 0.05);
    EXPECT_NEAR(zero_model_state_bytes(psi, 64, 1, Dtype::bf16) / 1e9, 31.4, 0.05);
    EXPECT_NEAR(zero_model_state_bytes(psi, 64, 2, Dtype::bf16) / 1e9, 16.6, 0.05);
    EXPECT_NEAR(zero_model_state_bytes(psi, 64, 3, Dtype::bf16) / 1e9, 1.9, 0.05);
    // Table 1 of the paper: 1T parameters on 1,024 GPUs with P_os+g+p: 15.6 GB.
    EXPECT_NEAR(zero_model_state_bytes(1e12, 1024, 3, Dtype::bf16) / 1e9, 15.6, 0.05);
    // fp32 training: 4 + 4 + 8 bytes.
    EXPECT_DOUBLE_EQ(zero_model_state_bytes(psi, 8, 0, Dtype::fp32), 16 * psi);
    EXPECT_DOUBLE_EQ(zero_model_state_bytes(psi, 8, 1, Dtype::fp32), 8 * psi + 8 * psi / 8);
}

// The planner's own memory model for the ZeRO paper's layout: plain DP.
TEST(PlanClosedForm, MemoryModelStatesAreZeroTimesStageParams) {
    auto in = input({"model.preset=gpt2-350m", "cluster.device=A100-80GB", "cluster.gpus=64",
                     "train.precision=bf16", "parallel.zero_stage=2", "train.batch_size=1",
                     "train.seq_len=1024"});
    const Memory m = memory_per_device(in.w, in.l, in.c);
    const double p = double(in.w.model.num_params());
    EXPECT_DOUBLE_EQ(m.params + m.grads + m.optimizer,
                     zero_model_state_bytes(p, 64, 2, Dtype::bf16));
}

// Kaplan et al. 2020 / Megatron: training FLOPs = 6 N D plus attention
// 12 L T C per token; GPT-3 175B on 300B tokens is 3.14e23 FLOPs (Brown et al.
// 2020, Table D.1, which counts 6ND only).
TEST(PlanClosedForm, SixNDAndAttentionFlops) {
    auto in = input({"model.preset=gpt3-175b", "train.seq_len=2048", "plan.global_batch=1536",
                     "train.batch_size=1"});
    const auto& m = in.w.model;
    const double per_token = 6.0 * double(m.num_matmul_params()) + 12.0 * 96 * 2048 * 12288;
    EXPECT_DOUBLE_EQ(model_flops_per_step(in.w), per_token * 2048 * 1536);
    const double six_nd = 6.0 * double(m.num_params()) * 300e9;
    EXPECT_NEAR(six_nd / 3.14e23, 1.0, 0.01);
    // Full recomputation adds one forward of the blocks: HFU/MFU = 4/3 minus
    // the LM head's and attention's share.
    const double rec = recompute_flops_per_step(in.w, Recompute::full);
    const double tokens = 2048.0 * 1536;
    const double block = double(m.num_matmul_params()) - double(m.vocab_size) * m.n_embd;
    EXPECT_DOUBLE_EQ(rec, (2 * block + 4.0 * 96 * 2048 * 12288) * tokens);
}

TEST(PlanClosedForm, BubbleFraction) {
    EXPECT_DOUBLE_EQ(bubble_fraction(8, 64, 1), 7.0 / 64);
    EXPECT_DOUBLE_EQ(bubble_fraction(16, 192, 2), 15.0 / 384);
    EXPECT_DOUBLE_EQ(bubble_fraction(1, 10, 1), 0.0);
    // The step time carries it: bubble = fraction x (m x the average stage's
    // time per micro-batch), the closed form when the stages are equal (a
    // vocabulary of 256: the head and embedding are a few percent).
    auto in = input({"model.preset=gpt2-350m", "cluster.device=A100-80GB", "cluster.gpus=8",
                     "parallel.pp=4", "train.batch_size=1", "plan.global_batch=32",
                     "model.vocab_size=256"});
    const StepTime st = step_time(in.w, in.l, in.c);
    EXPECT_NEAR(st.bubble_fraction, 3.0 / 16, 0.02 * 3.0 / 16);
    const double work = st.compute + st.recompute + st.tp_comm + st.pp_comm;
    EXPECT_NEAR(st.bubble, st.bubble_fraction * work, 1e-12 * work);
}

TEST(PlanClosedForm, RingAllReduce) {
    // 2(n-1)/n * S/B + 2(n-1) alpha: 8 ranks, 1 GB at 100 GB/s, 5 us.
    EXPECT_DOUBLE_EQ(ring_all_reduce_s(8, 1e9, 100e9, 5e-6), 2.0 * 7 / 8 * 1e-2 + 14 * 5e-6);
    EXPECT_DOUBLE_EQ(ring_all_reduce_s(1, 1e9, 100e9, 5e-6), 0.0);
    EXPECT_DOUBLE_EQ(ring_reduce_scatter_s(4, 4e6, 1e9, 1e-6), 3.0 / 4 * 4e-3 + 3e-6);
    // Inside one node the planner uses the link's sustained bandwidth.
    auto in = input({"cluster.device=A100-80GB", "cluster.gpus=8", "cluster.collective=ring"});
    const double bw = in.c.intra.bw * in.c.intra.efficiency;
    EXPECT_DOUBLE_EQ(all_reduce_s(in.c, Group{8, 1}, 1e9),
                     ring_all_reduce_s(8, 1e9, bw, in.c.intra.latency));
}

TEST(PlanClosedForm, GroupsCrossTheRightTier) {
    auto in = input({"cluster.device=A100-80GB", "cluster.gpus=4096"});
    EXPECT_EQ(group_path(in.c, Group{8, 1}).tier, "node");
    const Path dp = group_path(in.c, Group{32, 128});  // one member per node
    EXPECT_EQ(dp.per_node, 1);
    EXPECT_EQ(dp.nodes, 32);
    EXPECT_EQ(dp.tier, "spine");  // spans 4,096 devices > a 256-device rail unit
    EXPECT_EQ(group_path(in.c, Group{16, 8}).tier, "rail");
    // Crossing nodes is slower than staying inside one for the same bytes.
    EXPECT_GT(all_reduce_s(in.c, Group{8, 8}, 1e9), all_reduce_s(in.c, Group{8, 1}, 1e9));
}

// A fabric given by its measured or shaped rate and latency rather than a
// catalog name: the rate as tc writes it, one link per node shared by its
// ranks, and the ring all-reduce across the two nodes priced on it.
TEST(PlanClosedForm, LinkRateAndLatencyKeys) {
    auto in = input({"cluster.gpus=4", "cluster.gpus_per_node=2", "cluster.inter_link_rate=1gbit",
                     "cluster.inter_link_latency=100us", "cluster.intra_link_rate=4GB/s",
                     "cluster.intra_link_latency=2us", "cluster.collective=ring"});
    EXPECT_DOUBLE_EQ(in.c.inter.bw * in.c.inter.efficiency, 125e6);
    EXPECT_DOUBLE_EQ(in.c.inter.latency, 100e-6);
    EXPECT_DOUBLE_EQ(in.c.intra.latency, 2e-6);
    // 4 ranks on 2 nodes, each node's two ranks driving one link each (the
    // topology's tier adds its switch latency to the link's).
    EXPECT_GT(group_path(in.c, Group{4, 1}).inter_alpha, 100e-6);
    EXPECT_DOUBLE_EQ(all_reduce_s(in.c, Group{4, 1}, 1e9),
                     ring_all_reduce_s(4, 1e9, 250e6, group_path(in.c, Group{4, 1}).inter_alpha));

    auto shared = input({"cluster.gpus=4", "cluster.gpus_per_node=2",
                         "cluster.inter_link_rate=100mbit", "cluster.inter_link_efficiency=0.96",
                         "cluster.nic_shared=true", "cluster.collective=ring"});
    EXPECT_DOUBLE_EQ(shared.c.inter.bw * shared.c.inter.efficiency, 12.5e6 * 0.96 / 2);
    // Flat: the ring crosses each node's one link in each direction.
    EXPECT_DOUBLE_EQ(
        all_reduce_s(shared.c, Group{4, 1}, 1e9),
        ring_all_reduce_s(4, 1e9, 12.5e6 * 0.96, group_path(shared.c, Group{4, 1}).inter_alpha));
    // One member per node (dp across nodes beside tp inside): half the link.
    EXPECT_DOUBLE_EQ(all_reduce_s(shared.c, Group{2, 2}, 1e9),
                     ring_all_reduce_s(2, 1e9, 12.5e6 * 0.96 / 2,
                                       group_path(shared.c, Group{2, 2}).inter_alpha));

    for (const char* bad : {"cluster.inter_link_rate=1gb", "cluster.inter_link_rate=fast",
                            "cluster.inter_link_rate=-1gbit", "cluster.intra_link_rate=0GB/s"}) {
        try {
            input({bad});
            ADD_FAILURE() << bad << " was accepted";
        } catch (const ConfigError& e) {
            const std::string key = std::string(bad).substr(0, std::string(bad).find('='));
            EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find("1gbit"), std::string::npos) << e.what();
        }
    }
    EXPECT_THROW(input({"cluster.inter_link_latency=5 ms"}), ConfigError);
    EXPECT_THROW(input({"cluster.inter_link_latency=5"}), ConfigError);
}

// parallel.layout = auto is the trainer's: the planner says it prices the
// keys as given rather than ignoring it silently.
TEST(PlanClosedForm, AutoLayoutIsNamedAsTheTrainers) {
    auto warned = [](const PlanInput& in) {
        for (const auto& w : in.warnings) {
            if (w.find("parallel.layout = auto") != std::string::npos) return true;
        }
        return false;
    };
    EXPECT_TRUE(warned(input({"parallel.layout=auto"})));
    EXPECT_FALSE(warned(input({})));
}

// Korthikanti et al. 2022, Table 2, per layer: sbh(10 + 24/t + 5as/(ht)) and
// the variants, for 16-bit activations.
TEST(PlanClosedForm, KorthikantiActivations) {
    core::ModelSpec m = core::preset("gpt3-175b");
    const double s = 2048, b = 1, h = 12288, a = 96, t = 8, sbh = s * b * h;
    EXPECT_DOUBLE_EQ(layer_activation_bytes(m, 2048, 1, 8, false, Recompute::none, Dtype::bf16),
                     sbh * (10 + 24 / t + 5 * a * s / (h * t)));
    EXPECT_DOUBLE_EQ(layer_activation_bytes(m, 2048, 1, 8, true, Recompute::none, Dtype::bf16),
                     sbh * (34 / t + 5 * a * s / (h * t)));
    EXPECT_DOUBLE_EQ(
        layer_activation_bytes(m, 2048, 1, 8, false, Recompute::selective, Dtype::bf16),
        sbh * (10 + 24 / t));
    EXPECT_DOUBLE_EQ(layer_activation_bytes(m, 2048, 1, 8, true, Recompute::selective, Dtype::bf16),
                     sbh * 34 / t);
    EXPECT_DOUBLE_EQ(layer_activation_bytes(m, 2048, 1, 8, false, Recompute::full, Dtype::bf16),
                     2 * sbh);
    EXPECT_DOUBLE_EQ(layer_activation_bytes(m, 2048, 1, 8, true, Recompute::full, Dtype::bf16),
                     2 * sbh / t);
}

// Micro-batches in flight on the first stage: GPipe all m, 1F1B p,
// interleaved p (1 + (p - 1)/(p v)) (Narayanan et al. 2021; Korthikanti et
// al. 2022, Section 4.2.3). Recomputation off, so blocks dominate.
TEST(PlanClosedForm, PipelineScheduleActivationMemory) {
    auto base = std::vector<std::string>{
        "model.preset=gpt3-13b", "cluster.device=A100-80GB", "cluster.gpus=4",
        "parallel.pp=4",         "train.batch_size=1",       "plan.global_batch=16",
        "train.seq_len=2048",    "train.precision=bf16",     "plan.attention=materialized"};
    auto act = [&](const char* sched, int v) {
        auto sets = base;
        sets.push_back(std::string("parallel.schedule=") + sched);
        sets.push_back("parallel.virtual_stages=" + std::to_string(v));
        auto in = input(sets);
        return memory_per_device(in.w, in.l, in.c).activations;
    };
    auto in = input(base);
    const double per_layer =
        layer_activation_bytes(in.w.model, 2048, 1, 1, false, Recompute::none, Dtype::bf16);
    const double blocks = 10 * per_layer;  // 40 layers / 4 stages
    const double f1b = act("1f1b", 1), gpipe = act("gpipe", 1), inter = act("interleaved", 2);
    EXPECT_NEAR(f1b, 4 * blocks, 0.01 * f1b);  // + the embedding mask, < 1%
    EXPECT_NEAR(gpipe, 16 * blocks, 0.01 * gpipe);
    EXPECT_NEAR(inter, 4 * (1 + 3.0 / 8) * blocks, 0.01 * inter);
}

// The general per-block count equals Korthikanti's Table 2 for a GPT block
// with stored scores, and fused attention drops exactly the 5as^2b/t term.
TEST(PlanClosedForm, BlockActivationsMatchKorthikanti) {
    auto sets = std::vector<std::string>{"model.preset=gpt3-175b", "train.seq_len=2048",
                                         "parallel.tp=8",          "cluster.gpus=8",
                                         "train.batch_size=1",     "plan.attention=materialized",
                                         "train.precision=bf16",   "cluster.device=A100-80GB"};
    for (bool sp : {false, true}) {
        auto s2 = sets;
        s2.push_back(std::string("parallel.sequence_parallel=") + (sp ? "true" : "false"));
        auto in = input(s2);
        for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full}) {
            EXPECT_NEAR(block_activation_bytes(in.w, in.l, false, r),
                        layer_activation_bytes(in.w.model, 2048, 1, 8, sp, r, Dtype::bf16), 1.0);
        }
        in.w.flash = true;
        const double scores = 5.0 * 96 * 2048.0 * 2048 / 8;
        const double lse = 4.0 * 96 * 2048 / 8;
        EXPECT_NEAR(
            block_activation_bytes(in.w, in.l, false, Recompute::none),
            layer_activation_bytes(in.w.model, 2048, 1, 8, sp, Recompute::none, Dtype::bf16) -
                scores + lse,
            1.0);
    }
}

// Mixture of experts: total and active parameters of DeepSeek-V3 (671B and
// 37B, DeepSeek-V3 technical report, Table 1; the MTP module excluded).
TEST(PlanClosedForm, DeepSeekV3Parameters) {
    const auto in = input(
        {"model.preset=llama3-8b", "model.n_layer=61", "model.n_embd=7168", "model.n_head=128",
         "model.n_kv_head=128", "model.head_dim=128", "model.kv_lora_rank=512",
         "model.q_lora_rank=1536", "model.qk_rope_dim=64", "model.v_head_dim=128",
         "model.n_expert=256", "model.n_expert_active=8", "model.n_shared_expert=1",
         "model.moe_ffn_hidden=2048", "model.ffn_hidden=18432", "model.moe_dense_layers=3",
         "model.vocab_size=129280", "model.max_seq_len=4096", "train.seq_len=4096"});
    EXPECT_NEAR(double(in.w.model.num_params()) / 671e9, 1.0, 0.01);
    // Active: the routed experts a token uses, plus the embedding (37B counts it).
    const double active = double(in.w.model.num_active_matmul_params()) + 129280.0 * 7168;
    EXPECT_NEAR(active / 37e9, 1.0, 0.03);
}

TEST(PlanClosedForm, YoungDalyAndGoodput) {
    EXPECT_DOUBLE_EQ(young_interval_s(60, 3600 * 24), std::sqrt(2.0 * 60 * 86400));
    // Daly's correction shortens Young's interval by about delta.
    const double d = daly_interval_s(60, 86400), y = young_interval_s(60, 86400);
    EXPECT_LT(d, y);
    EXPECT_NEAR(d, y - 60, 0.02 * y);
    // The optimum maximises goodput.
    const double best = goodput(d, 60, 86400, 600);
    EXPECT_GT(best, goodput(d / 2, 60, 86400, 600));
    EXPECT_GT(best, goodput(d * 2, 60, 86400, 600));
    // No failures to speak of: goodput is 1 - delta/tau to first order.
    EXPECT_NEAR(goodput(3600, 36, 1e12, 0), 1 / 1.01, 1e-6);
}

TEST(PlanClosedForm, CarbonProfileAndBestStart) {
    // 2 kW for 3 hours on a 4-hour profile starting at hour 2: 2*(30+40+10).
    const std::vector<double> prof{10, 20, 30, 40};
    EXPECT_DOUBLE_EQ(profile_gco2(prof, 2, 3, 2), 2 * (30 + 40 + 10));
    EXPECT_DOUBLE_EQ(profile_gco2(prof, 0, 8.5, 1), 2 * 100 + 0.5 * 10);
    auto in = input({"model.preset=gpt2-124m", "cluster.device=A100-80GB", "cluster.gpus=8",
                     "plan.tokens=1e9"});
    in.c.gco2_profile = {500, 500, 100, 100, 500, 500};
    const Plan p = evaluate(in.w, in.l, in.c);
    EXPECT_LE(p.tot.best_co2e_t, p.tot.co2e_t);
    EXPECT_GE(p.tot.best_start_hour, 1.0);  // starting on the clean hours
    EXPECT_LE(p.tot.best_start_hour, 3.0);
}

TEST(PlanClosedForm, EnergyAndCostIdentities) {
    // Llama 2 model card accounting: device-hours x TDP (400 W), PUE 1, and
    // 31.22 tCO2e for 184,320 A100-hours implies 423.5 gCO2e/kWh.
    auto in = input({"model.preset=llama2-7b", "cluster.device=A100-80GB", "cluster.gpus=64",
                     "train.seq_len=4096", "train.batch_size=1", "plan.global_batch=64",
                     "parallel.zero_stage=3", "train.precision=bf16", "plan.tokens=1e9",
                     "cluster.idle_frac=1", "cluster.pue=1", "cluster.network_w_per_device=0",
                     "cluster.gco2_per_kwh=423.5", "cluster.mtbf_node_hours=1e9"});
    in.c.dev.host_w_per_node = 0;
    const Plan p = evaluate(in.w, in.l, in.c);
    EXPECT_NEAR(p.tot.energy_kwh, p.tot.gpu_hours * 0.4, 1e-9 * p.tot.energy_kwh);
    EXPECT_NEAR(p.tot.co2e_t / p.tot.gpu_hours * 184320, 31.22, 0.05);
    EXPECT_NEAR(p.tot.cost_on_demand_usd, p.tot.gpu_hours * in.c.price_hour,
                1e-6 * p.tot.cost_on_demand_usd);
    // Spot is cheaper per hour but preemptions stretch the wall time.
    EXPECT_GT(p.tot.spot_wall_s, p.tot.wall_s);
}

}  // namespace
}  // namespace apiary::plan
