// Published training runs as test cases: the planner must land within 15% of
// measured throughput and within 10% of published memory. Each case states
// the figure and where it was published. The A100's one fitted constant
// (gemm_eff = 0.70, plan/catalog.cc) was chosen against Korthikanti et al.
// 2022's 175B run; every other case is out of sample.

#include <gtest/gtest.h>

#include <string>

#include "plan/memory.h"
#include "test_util.h"

namespace apiary::plan {
namespace {

using test::megatron_gpt;
using test::operator+;
using test::plan_of;

struct MegatronRun {
    const char* name;
    int layers, hidden, heads, tp, pp, gpus, batch;
    double tflops;  // achieved TFLOP/s per GPU, recomputation included
};

// Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on
// GPU Clusters Using Megatron-LM", Table 1 (weak scaling, A100-80GB,
// vocabulary 51,200, sequence 2,048, full activation recomputation; the
// reported FLOP/s count the recomputed forward: 96 B s l h^2 (1 + s/6h +
// V/16lh)).
const MegatronRun kTable1[] = {
    {"1.7B", 24, 2304, 24, 1, 1, 32, 512, 137},
    {"3.6B", 30, 3072, 32, 2, 1, 64, 512, 138},
    {"7.5B", 36, 4096, 32, 4, 1, 128, 512, 142},
    {"18.4B", 40, 6144, 48, 8, 1, 256, 1024, 135},
    {"39.1B", 48, 8192, 64, 8, 2, 512, 1536, 138},
    {"76.1B", 60, 10240, 80, 8, 4, 1024, 1792, 140},
    {"145.6B", 80, 12288, 96, 8, 8, 1536, 2304, 148},
    {"310.1B", 96, 16384, 128, 8, 16, 1920, 2160, 155},
    {"529.6B", 105, 20480, 128, 8, 35, 2520, 2520, 163},
    {"1008B", 128, 25600, 160, 8, 64, 3072, 3072, 163},
};

std::vector<std::string> megatron_layout(const MegatronRun& r, const char* recompute) {
    return megatron_gpt(r.layers, r.hidden, r.heads) +
           std::vector<std::string>{
               "cluster.device=A100-80GB",
               "cluster.gpus=" + std::to_string(r.gpus),
               "parallel.tp=" + std::to_string(r.tp),
               "parallel.pp=" + std::to_string(r.pp),
               "plan.global_batch=" + std::to_string(r.batch),
               "train.batch_size=1",
               "train.precision=fp16",
               std::string("parallel.recompute=") + recompute,
           };
}

double hw_tflops(const Plan& p) {
    return p.st.hw_flops / p.st.total / double(p.l.devices()) / 1e12;
}

TEST(PlanPublished, MegatronTable1WeakScaling) {
    for (const auto& r : kTable1) {
        const Plan p = plan_of(megatron_layout(r, "full"));
        EXPECT_TRUE(p.fits) << r.name << ": " << p.why;
        EXPECT_NEAR(hw_tflops(p) / r.tflops, 1.0, 0.15)
            << r.name << ": planner " << hw_tflops(p) << " TFLOP/s, published " << r.tflops;
    }
}

// Narayanan et al. 2021, Section 5.1: GPT-3 175B on 1,024 A100s at batch 1,536
// sustains 140 TFLOP/s per GPU, so 300B tokens take about 34 days
// (8 T P / (n X) = 8 x 300e9 x 175e9 / (1024 x 140e12)).
TEST(PlanPublished, Gpt3On1024A100) {
    const Plan p =
        plan_of({"model.preset=gpt3-175b", "model.vocab_size=51200", "train.seq_len=2048",
                 "cluster.device=A100-80GB", "cluster.gpus=1024", "parallel.tp=8", "parallel.pp=16",
                 "plan.global_batch=1536", "train.batch_size=1", "train.precision=fp16",
                 "parallel.recompute=full", "plan.tokens=300e9", "cluster.mtbf_node_hours=1e9"});
    ASSERT_TRUE(p.fits) << p.why;
    EXPECT_NEAR(hw_tflops(p) / 140.0, 1.0, 0.15) << hw_tflops(p);
    EXPECT_NEAR(p.tot.wall_s / 86400 / 34.0, 1.0, 0.15) << p.tot.wall_s / 86400;
}

// Narayanan et al. 2021, Table 2 (PTD-P rows): GPT-3 175B (t = 8, p = 12,
// batch 1,536) on 384 / 768 / 1,536 A100s: 153 / 149 / 141 TFLOP/s per GPU
// and 84 / 43 / 23 days for 300B tokens; the 530B model (t = 8, p = 35,
// batch 2,240) on 560 / 1,120 / 2,240: 171 / 167 / 159. Interleaved schedule
// for 175B (Section 5.3.2), microbatch 1. (The ZeRO-3 rows of the same table,
// DeepSpeed 2021, are a known miss: docs/planner.md.)
TEST(PlanPublished, MegatronTable2StrongScaling) {
    struct Row {
        int gpus;
        double tflops, days;
    };
    for (const Row& r : {Row{384, 153, 84}, Row{768, 149, 43}, Row{1536, 141, 23}}) {
        const Plan p = plan_of(
            megatron_gpt(96, 12288, 96) +
            std::vector<std::string>{
                "cluster.device=A100-80GB", "cluster.gpus=" + std::to_string(r.gpus),
                "parallel.tp=8", "parallel.pp=12", "plan.global_batch=1536", "train.batch_size=1",
                "train.precision=fp16", "parallel.recompute=full", "parallel.schedule=interleaved",
                "parallel.virtual_stages=2", "plan.tokens=300e9", "cluster.mtbf_node_hours=1e9"});
        EXPECT_NEAR(hw_tflops(p) / r.tflops, 1.0, 0.15) << r.gpus << ": " << hw_tflops(p);
        EXPECT_NEAR(p.tot.wall_s / 86400 / r.days, 1.0, 0.15) << r.gpus;
    }
    for (const Row& r : {Row{560, 171, 156}, Row{1120, 167, 80}, Row{2240, 159, 42}}) {
        const Plan p =
            plan_of(megatron_gpt(105, 20480, 128) +
                    std::vector<std::string>{
                        "cluster.device=A100-80GB", "cluster.gpus=" + std::to_string(r.gpus),
                        "parallel.tp=8", "parallel.pp=35", "plan.global_batch=2240",
                        "train.batch_size=1", "train.precision=fp16", "parallel.recompute=full",
                        "plan.tokens=300e9", "cluster.mtbf_node_hours=1e9"});
        EXPECT_NEAR(hw_tflops(p) / r.tflops, 1.0, 0.15) << r.gpus << ": " << hw_tflops(p);
        EXPECT_NEAR(p.tot.wall_s / 86400 / r.days, 1.0, 0.15) << r.gpus;
    }
}

// Narayanan et al. 2021, Table 2, ZeRO-3 rows (DeepSpeed 2021, no model
// parallelism, 175B, batch 1,536): 144 / 88 / 44 TFLOP/s per GPU on 384 / 768
// / 1,536 GPUs (micro-batch 4 / 2 / 1). With the planner's defaults
// (FSDP-style: one gather per block, overlapped) it predicts ~200 throughout
// (what a modern FSDP would do). Described as that implementation ran
// (cluster.implementation = deepspeed: a gather per parameter tensor, 12 per
// GPT block, no overlap), the collapse comes from NCCL's all-gather and
// reduce-scatter being flat rings: (n - 1) alpha per collective, 3,456
// collectives per micro-batch. Within 20%, and the 1,536/384 ratio
// (published 0.31) within 0.25-0.40.
TEST(PlanPublished, ZeroThreeCollapseWithPerTensorGathers) {
    struct Row {
        int gpus, micro;
        double tflops;
    };
    std::vector<double> got;
    for (const Row& r : {Row{384, 4, 144}, Row{768, 2, 88}, Row{1536, 1, 44}}) {
        const Plan p =
            plan_of(megatron_gpt(96, 12288, 96) +
                    std::vector<std::string>{
                        "cluster.device=A100-80GB", "cluster.gpus=" + std::to_string(r.gpus),
                        "parallel.zero_stage=3", "plan.global_batch=1536",
                        "train.batch_size=" + std::to_string(r.micro), "train.precision=fp16",
                        "parallel.recompute=full", "cluster.implementation=deepspeed"});
        EXPECT_NEAR(hw_tflops(p) / r.tflops, 1.0, 0.20) << r.gpus << ": " << hw_tflops(p);
        got.push_back(hw_tflops(p));
    }
    EXPECT_GT(got[2] / got[0], 0.25);
    EXPECT_LT(got[2] / got[0], 0.40);
}

// The same runs with the default (overlapped, one flat gather per block)
// ZeRO-3: no collapse, so the implementation is what the collapse measures.
TEST(PlanPublished, ZeroThreeWithFlatGathersDoesNotCollapse) {
    std::vector<double> got;
    for (const auto& [gpus, micro] : {std::pair{384, 4}, std::pair{1536, 1}}) {
        got.push_back(hw_tflops(
            plan_of(megatron_gpt(96, 12288, 96) +
                    std::vector<std::string>{"cluster.device=A100-80GB",
                                             "cluster.gpus=" + std::to_string(gpus),
                                             "parallel.zero_stage=3", "plan.global_batch=1536",
                                             "train.batch_size=" + std::to_string(micro),
                                             "train.precision=fp16", "parallel.recompute=full"})));
    }
    EXPECT_GT(got[1] / got[0], 0.85) << got[0] << " " << got[1];
}

struct KorthikantiRun {
    const char* name;
    int layers, hidden, heads, pp, gpus, batch, micro, vpp;
    double full_s, present_s;  // iteration time, full recompute / SP + selective
    double mfu, hfu;           // of the present work
};

// Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
// Transformer Models": Table 3 (configurations: t = 8, s = 2048, v = 51,200,
// no data parallelism, interleaved schedule with 3 stages for 175B and 530B)
// and Table 5 (iteration time with full recomputation and with sequence
// parallelism + selective recomputation; MFU / HFU of the latter).
const KorthikantiRun kKorthikanti[] = {
    {"22B", 48, 6144, 64, 1, 8, 4, 4, 1, 1.42, 1.10, 0.415, 0.437},
    {"175B", 96, 12288, 96, 8, 64, 64, 1, 3, 18.13, 13.75, 0.514, 0.528},
    {"530B", 105, 20480, 128, 35, 280, 280, 1, 3, 49.05, 37.83, 0.560, 0.570},
    {"1T", 128, 25600, 160, 64, 512, 512, 1, 1, 94.42, 71.49, 0.563, 0.570},
};

std::vector<std::string> korthikanti_layout(const KorthikantiRun& r, const char* recompute,
                                            bool sp) {
    std::vector<std::string> v =
        megatron_gpt(r.layers, r.hidden, r.heads) +
        std::vector<std::string>{
            "cluster.device=A100-80GB",
            "cluster.gpus=" + std::to_string(r.gpus),
            "parallel.tp=8",
            "parallel.pp=" + std::to_string(r.pp),
            "plan.global_batch=" + std::to_string(r.batch),
            "train.batch_size=" + std::to_string(r.micro),
            "train.precision=bf16",
            std::string("parallel.recompute=") + recompute,
            std::string("parallel.sequence_parallel=") + (sp ? "true" : "false"),
        };
    if (r.vpp > 1) {
        v.push_back("parallel.schedule=interleaved");
        v.push_back("parallel.virtual_stages=" + std::to_string(r.vpp));
    }
    return v;
}

TEST(PlanPublished, KorthikantiIterationTimes) {
    for (const auto& r : kKorthikanti) {
        const Plan full = plan_of(korthikanti_layout(r, "full", false));
        EXPECT_TRUE(full.fits) << r.name << ": " << full.why;
        EXPECT_NEAR(full.st.total / r.full_s, 1.0, 0.15)
            << r.name << " full recompute: planner " << full.st.total << " s";
        const Plan p = plan_of(korthikanti_layout(r, "selective", true));
        EXPECT_TRUE(p.fits) << r.name << ": " << p.why;
        EXPECT_NEAR(p.st.total / r.present_s, 1.0, 0.15)
            << r.name << " SP + selective: planner " << p.st.total << " s";
        EXPECT_NEAR(p.st.mfu / r.mfu, 1.0, 0.15) << r.name << ": planner MFU " << p.st.mfu;
        EXPECT_NEAR(p.st.hfu / r.hfu, 1.0, 0.15) << r.name << ": planner HFU " << p.st.hfu;
        // The paper's headline: ~30% faster than full recomputation.
        EXPECT_NEAR(full.st.total / p.st.total, r.full_s / r.present_s, 0.1) << r.name;
    }
}

// Korthikanti et al. 2022, Section 6.3: the 530B model with 8-way data
// parallelism (2,240 GPUs, batch 2,240) takes 39.15 s per iteration (MFU
// 54.2%), gradient all-reduce not overlapped with backward.
TEST(PlanPublished, Korthikanti530BWithDataParallelism) {
    KorthikantiRun r = kKorthikanti[2];
    r.gpus = 2240, r.batch = 2240;
    const Plan p = plan_of(korthikanti_layout(r, "selective", true) +
                           std::vector<std::string>{"cluster.dp_overlap=0"});
    EXPECT_NEAR(p.st.total / 39.15, 1.0, 0.15) << p.st.total;
    EXPECT_NEAR(p.st.mfu / 0.542, 1.0, 0.15) << p.st.mfu;
    EXPECT_GT(p.st.dp_exposed, 0);
}

// Korthikanti et al. 2022, Section 6.1: "Without the memory savings provided
// by sequence parallelism and selective recompute together, none of these
// models will fit into memory" (80 GB). The planner agrees for 175B, 530B
// and 1T; for 22B it finds selective recomputation alone fits (~73 GiB).
TEST(PlanPublished, KorthikantiOnlyBothTechniquesTogetherFit) {
    for (const auto& r : {kKorthikanti[1], kKorthikanti[2], kKorthikanti[3]}) {
        EXPECT_FALSE(plan_of(korthikanti_layout(r, "none", false)).fits) << r.name;
        EXPECT_FALSE(plan_of(korthikanti_layout(r, "none", true)).fits) << r.name;
        EXPECT_FALSE(plan_of(korthikanti_layout(r, "selective", false)).fits) << r.name;
        EXPECT_TRUE(plan_of(korthikanti_layout(r, "selective", true)).fits) << r.name;
    }
}

// Korthikanti et al. 2022, Section 6.1 and Figure 7: sequence parallelism
// with selective recomputation cuts activation memory about 5x against the
// tensor-parallel baseline (530B and 1T, t = 8).
TEST(PlanPublished, KorthikantiFiveTimesLessActivationMemory) {
    for (const auto& r : {kKorthikanti[2], kKorthikanti[3]}) {
        core::ModelSpec m = core::preset("gpt3-175b");
        m.n_layer = r.layers, m.n_embd = r.hidden, m.n_head = r.heads, m.n_kv_head = r.heads;
        const double none =
            layer_activation_bytes(m, 2048, 1, 8, false, Recompute::none, Dtype::bf16);
        const double both =
            layer_activation_bytes(m, 2048, 1, 8, true, Recompute::selective, Dtype::bf16);
        EXPECT_NEAR(none / both, 5.0, 0.5) << r.name;
    }
}

// Rajbhandari et al. 2020 (ZeRO), Section 1 / Figure 1: a 7.5B model on 64
// GPUs needs 120 GB per GPU of model states without sharding and 1.9 GB
// with P_os+g+p. The planner's per-device model states for a 7.5B GPT
// (Megatron 7.5B shape) on 64 GPUs must land within 10%.
TEST(PlanPublished, ZeroPaperModelStates) {
    for (const auto& [stage, gb] : {std::pair{0, 120.0}, {1, 31.4}, {2, 16.6}, {3, 1.9}}) {
        const Plan p =
            plan_of(megatron_gpt(36, 4096, 32) +
                    std::vector<std::string>{"cluster.device=A100-80GB", "cluster.gpus=64",
                                             "parallel.zero_stage=" + std::to_string(stage),
                                             "train.batch_size=1", "train.precision=fp16"});
        const double states = (p.mem.params + p.mem.grads + p.mem.optimizer) / 1e9;
        EXPECT_NEAR(states / gb, 1.0, 0.10) << "stage " << stage << ": " << states << " GB";
    }
}

// Smith et al. 2022, "Using DeepSpeed and Megatron to Train Megatron-Turing
// NLG 530B", Table 2: 280 / 350 / 420 DGX A100 nodes, t = 8, p = 35, batch
// 1,920: 126 / 121 / 113 TFLOP/s per GPU (iteration 60.1 / 50.2 / 44.4 s).
// A known miss: DeepSpeed's pipeline engine reached ~77% of what
// Megatron-LM reached on the same 530B shape (163 TFLOP/s, Table 1 above),
// and the planner models one software stack, so it lands ~20-28% high.
// Checked at 30% so that a regression still fails; see docs/planner.md.
TEST(PlanPublished, MtNlgKnownOptimism) {
    const std::pair<int, double> runs[] = {{2240, 126}, {2800, 121}, {3360, 113}};
    double prev = 1e9;
    for (const auto& [gpus, tflops] : runs) {
        const Plan p =
            plan_of(megatron_gpt(105, 20480, 128) +
                    std::vector<std::string>{
                        "cluster.device=A100-80GB", "cluster.gpus=" + std::to_string(gpus),
                        "parallel.tp=8", "parallel.pp=35", "plan.global_batch=1920",
                        "train.batch_size=1", "train.precision=bf16", "parallel.recompute=full"});
        EXPECT_NEAR(hw_tflops(p) / tflops, 1.0, 0.30) << gpus << ": " << hw_tflops(p);
        EXPECT_GT(hw_tflops(p), tflops);  // the direction of the known bias
        // Per-GPU throughput falls as the pipeline gets fewer micro-batches.
        EXPECT_LT(hw_tflops(p), prev);
        prev = hw_tflops(p);
    }
}

// BLOOM-176B (BigScience 2022; Le Scao et al. 2022, Section 3.4; BigScience
// training notes): 384 A100-80GB on Jean Zay (4 x 100 Gb/s Omni-Path per
// 8-GPU node), tp 4, pp 12, dp 8, ZeRO-1, bf16, 70 layers, width 14,336, 112
// heads, vocabulary 250,880 (padded), sequence 2,048, global batch 2,048:
// "about 150 TFLOPs" per GPU, and 1,082,990 GPU-hours for 366B tokens.
// Assumed (not in the sources): micro-batch 2, full activation checkpointing.
// It ran Megatron-DeepSpeed's pipeline engine: the `deepspeed` profile.
// Not checked: the notes' "60 GB of memory on each GPU", which is what the
// caching allocator held; the planner counts what is needed (~36 GiB).
TEST(PlanPublished, Bloom176B) {
    const Plan p =
        plan_of(megatron_gpt(70, 14336, 112) +
                std::vector<std::string>{
                    "model.vocab_size=250880", "cluster.device=A100-80GB", "cluster.gpus=384",
                    "cluster.inter_link=opa-100-half", "cluster.topology=fat-tree", "parallel.tp=4",
                    "parallel.pp=12", "parallel.zero_stage=1", "plan.global_batch=2048",
                    "train.batch_size=2", "train.precision=bf16", "parallel.recompute=full",
                    "plan.tokens=366e9", "cluster.implementation=deepspeed"});
    ASSERT_TRUE(p.fits) << p.why;
    EXPECT_NEAR(hw_tflops(p) / 150.0, 1.0, 0.15) << hw_tflops(p);
    EXPECT_NEAR(p.tot.gpu_hours / 1082990.0, 1.0, 0.15) << p.tot.gpu_hours;
}

// Luccioni et al. 2022, "Estimating the Carbon Footprint of BLOOM": training
// used 433,196 kWh (GPU-hours x 400 W TDP, dynamic power only) and emitted
// 24.69 t CO2e at Jean Zay's 57 gCO2e/kWh. The planner with the same
// accounting (devices at TDP, no host or network, PUE 1) on its own BLOOM
// prediction lands within 15%.
TEST(PlanPublished, BloomEnergyAndCarbon) {
    const Plan p =
        plan_of(megatron_gpt(70, 14336, 112) +
                std::vector<std::string>{
                    "model.vocab_size=250880", "cluster.device=A100-80GB", "cluster.gpus=384",
                    "cluster.inter_link=opa-100-half", "cluster.topology=fat-tree", "parallel.tp=4",
                    "parallel.pp=12", "parallel.zero_stage=1", "plan.global_batch=2048",
                    "train.batch_size=2", "train.precision=bf16", "parallel.recompute=full",
                    "plan.tokens=366e9", "cluster.implementation=deepspeed", "cluster.idle_frac=1",
                    "cluster.pue=1", "cluster.host_w_per_node=0", "cluster.network_w_per_device=0",
                    "cluster.gco2_per_kwh=57"});
    EXPECT_NEAR(p.tot.energy_kwh / 433196.0, 1.0, 0.15) << p.tot.energy_kwh;
    EXPECT_NEAR(p.tot.co2e_t / 24.69, 1.0, 0.15) << p.tot.co2e_t;
}

// Layouts the papers could not run must not fit here either: GPT-3 175B
// without any parallelism needs ~2.8 TB of model states (16 bytes/param).
TEST(PlanPublished, Gpt3DoesNotFitOnOneGpu) {
    const Plan p = plan_of({"model.preset=gpt3-175b", "cluster.device=A100-80GB", "cluster.gpus=1",
                            "train.precision=bf16", "train.batch_size=1", "train.seq_len=2048"});
    EXPECT_FALSE(p.fits);
    EXPECT_NEAR((p.mem.params + p.mem.grads + p.mem.optimizer) / 1e12, 2.8, 0.1);
    EXPECT_NE(p.why.find("A100-80GB"), std::string::npos);
}

}  // namespace
}  // namespace apiary::plan
