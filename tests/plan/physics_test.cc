// The physical effects behind the validation set's former misses, each on
// its own: NCCL's ring-only all-gather, the roofline of small GEMMs, fp8's
// casts, the host-bound dropless MoE block, exposed all-gather context
// parallelism, FSDP under pipeline parallelism and the caching allocator.

#include <gtest/gtest.h>

#include "plan/collectives.h"
#include "plan/memory.h"
#include "plan/step_time.h"
#include "test_util.h"

namespace apiary::plan {
namespace {

using test::input;
using test::operator+;

double step_s(const PlanInput& in) { return step_time(in.w, in.l, in.c).total; }

// NCCL all-gather and reduce-scatter are flat rings whatever the size: the
// latency term grows as (n - 1) alpha, where an all-reduce may use a tree.
TEST(PlanPhysics, AllGatherIsAFlatRingAcrossNodes) {
    const auto in = input({"cluster.device=A100-80GB", "cluster.gpus=1536"});
    const Group g{1536, 1};
    const Path p = group_path(in.c, g);
    ASSERT_GT(p.nodes, 1);
    const double bus = std::min(p.inter_bw * double(p.per_node), p.intra_bw);
    const double bytes = 300e6;
    EXPECT_NEAR(reduce_scatter_s(in.c, g, bytes),
                0.5 * ring_all_reduce_s(1536, bytes, bus, p.inter_alpha), 1e-12);
    // An all-reduce of the same bytes may take the tree: far fewer latency steps.
    EXPECT_LT(all_reduce_s(in.c, g, bytes), 2 * reduce_scatter_s(in.c, g, bytes));
    // Asking for the hierarchical algorithm is still honoured.
    const auto hier =
        input({"cluster.device=A100-80GB", "cluster.gpus=1536", "cluster.collective=hierarchical"});
    EXPECT_LT(reduce_scatter_s(hier.c, g, bytes), reduce_scatter_s(in.c, g, bytes));
}

// A narrow model reaches a lower fraction of peak than a wide one on the same
// device: its GEMMs move more bytes per FLOP (the roofline term).
TEST(PlanPhysics, NarrowModelsReachLessOfPeak) {
    auto mfu = [](int layers, int width, int heads) {
        const auto in =
            input(test::megatron_gpt(layers, width, heads) +
                  std::vector<std::string>{"cluster.device=H100-SXM", "cluster.gpus=1",
                                           "train.batch_size=1", "train.precision=bf16"});
        return step_time(in.w, in.l, in.c).mfu;
    };
    EXPECT_LT(mfu(24, 1024, 16), 0.9 * mfu(8, 8192, 64));
}

// fp8 halves GEMM time at best: attention, elementwise work and the casts of
// every GEMM input and output gradient stay, so a narrow model gains least.
TEST(PlanPhysics, Fp8SpeedupIsBelowTwoAndSmallerForNarrowModels) {
    auto speedup = [](int layers, int width, int heads) {
        const auto base = test::megatron_gpt(layers, width, heads) +
                          std::vector<std::string>{"cluster.device=H100-SXM", "cluster.gpus=1",
                                                   "train.batch_size=4", "plan.attention=flash"};
        return step_s(input(base + std::vector<std::string>{"train.precision=bf16"})) /
               step_s(input(base + std::vector<std::string>{"train.precision=fp8"}));
    };
    const double narrow = speedup(24, 2048, 16), wide = speedup(8, 12288, 96);
    EXPECT_GT(narrow, 1.0);
    EXPECT_LT(narrow, wide);
    EXPECT_LT(wide, 2.0);
}

// A dropless MoE block with many small local experts is bound by the host
// launching their kernels; large experts hide the launches.
TEST(PlanPhysics, FineGrainedExpertsAreHostBound) {
    const std::vector<std::string> moe = {
        "model.preset=llama3-8b",  "model.n_layer=8",     "model.n_embd=2048",
        "model.n_head=16",         "model.n_kv_head=4",   "model.n_expert=128",
        "model.n_expert_active=8", "cluster.device=B200", "cluster.gpus=8",
        "parallel.ep=8",           "train.batch_size=1",  "train.seq_len=4096",
        "plan.global_batch=8",     "train.precision=fp8"};
    auto host_share = [&](const char* width) {
        auto in =
            input(moe + std::vector<std::string>{std::string("model.moe_ffn_hidden=") + width});
        const double with = step_s(in);
        in.c.launch_s = 0;
        return with / step_s(in) - 1;
    };
    const double small = host_share("256"), large = host_share("8192");
    EXPECT_GT(small, 0.2);
    EXPECT_LT(large, small / 4);
}

// Llama 3's context parallelism all-gathers keys and values before attention
// (Dubey et al. 2024, Section 3.3.2): the exchange is exposed, not hidden.
TEST(PlanPhysics, AllGatherContextParallelismIsExposed) {
    const std::vector<std::string> base = {
        "model.preset=llama3-8b",  "model.max_seq_len=131072", "train.seq_len=131072",
        "cluster.device=H100-SXM", "cluster.gpus=16",          "parallel.cp=16",
        "train.batch_size=1",      "plan.global_batch=1",      "train.precision=bf16"};
    const StepTime ring = [&] {
        const auto in = input(base);
        return step_time(in.w, in.l, in.c);
    }();
    const auto ag = input(base + std::vector<std::string>{"cluster.cp_overlap=0"});
    const StepTime gathered = step_time(ag.w, ag.l, ag.c);
    EXPECT_GT(gathered.cp_comm, 0);
    EXPECT_GT(gathered.cp_comm, ring.cp_comm);
    EXPECT_NEAR(gathered.total - ring.total, gathered.cp_comm - ring.cp_comm, 1e-9);
}

// FSDP under pipeline parallelism keeps the stage gathered (16-bit weights)
// and its gradients unsharded in fp32 until the last micro-batch; its loss
// materialises bf16 logits, an fp32 copy and the fp32 gradient.
TEST(PlanPhysics, FsdpWithPipelineKeepsTheStageGathered) {
    const std::vector<std::string> base = {"model.preset=llama3-70b",
                                           "cluster.device=H100-SXM",
                                           "cluster.gpus=64",
                                           "parallel.tp=8",
                                           "parallel.pp=4",
                                           "parallel.zero_stage=3",
                                           "cluster.implementation=fsdp",
                                           "train.batch_size=1",
                                           "plan.global_batch=16",
                                           "train.seq_len=8192",
                                           "train.precision=bf16",
                                           "parallel.recompute=full"};
    const auto in = input(base);
    const Memory m = memory_per_device(in.w, in.l, in.c);
    const double stage =
        stage_params_per_device(in.w.model, in.l, stage_split(in.w, in.l, in.c.impl));
    EXPECT_GT(m.buffers, 6.0 * stage);
    auto pp1 = input(base + std::vector<std::string>{"parallel.pp=1", "plan.global_batch=64"});
    // Without a pipeline only two blocks are gathered at a time.
    EXPECT_LT(memory_per_device(pp1.w, pp1.l, pp1.c).buffers, 0.25 * m.buffers);
    // The last stage's logits: 10 sbV/t unfused against Megatron's 4 sbV/t.
    auto meg = input(base + std::vector<std::string>{"cluster.implementation=megatron"});
    Layout last = in.l;
    last.pp = 1;
    const double sbv = 8192.0 * 128256 / 8;
    EXPECT_NEAR(memory_per_device(in.w, last, in.c).activations -
                    memory_per_device(meg.w, last, meg.c).activations,
                6 * sbv, 1e-3 * sbv);
}

// The caching allocator's reserve scales with the activations; the CPU
// device (this project's own allocator) has none.
TEST(PlanPhysics, AllocatorReserveFollowsActivations) {
    const auto gpu = input({"model.preset=llama3-8b", "cluster.device=H100-SXM", "cluster.gpus=1",
                            "train.seq_len=4096", "train.batch_size=1", "train.precision=bf16"});
    const Memory m = memory_per_device(gpu.w, gpu.l, gpu.c);
    EXPECT_NEAR(m.allocator, gpu.c.alloc_frac * m.activations, 1.0);
    EXPECT_GT(gpu.c.alloc_frac, 0);
    const auto cpu = input({"model.preset=tiny", "train.seq_len=64", "train.batch_size=2"});
    EXPECT_EQ(memory_per_device(cpu.w, cpu.l, cpu.c).allocator, 0);
}

// Megatron-LM's 2019 code all-reduced gradients after backward and ran
// unfused kernels; its profile carries both.
// apiary's trainer (src/model/stage.cc) keeps, per GPT block in fp32 and
// one micro-batch, the two norm outputs, the residuals after attention and
// after the MLP, QKV, the attention output and log-sum-exp, the MLP input
// and activation: 4 sb (4C + 12C/t) + 4 a sb/t bytes, no dropout masks. Its
// head computes loss and gradient through blocks of 512 rows in a scratch
// buffer, so no logits are kept across the step.
TEST(PlanPhysics, ApiaryKeepsWhatItsTrainerKeeps) {
    const std::vector<std::string> gpt = {"model.preset=gpt2-124m", "cluster.gpus=4",
                                          "parallel.tp=4",          "train.batch_size=8",
                                          "train.seq_len=128",      "train.precision=fp32"};
    const auto in = input(gpt);
    ASSERT_EQ(in.c.impl, Impl::apiary);
    const double sb = 8 * 128, C = 768, t = 4;
    EXPECT_NEAR(block_activation_bytes(in.w, in.l, false, Recompute::none),
                4 * sb * (4 * C + 12 * C / t) + 4 * 12 * sb / t, 1.0);
    // A larger vocabulary adds one block of rows' logits to the buffers,
    // nothing to the activations (256 rows when the vocabulary is split).
    const auto big = input(gpt + std::vector<std::string>{"model.vocab_size=100000"});
    const Memory m = memory_per_device(in.w, in.l, in.c);
    const Memory mb = memory_per_device(big.w, big.l, big.c);
    EXPECT_NEAR(mb.activations, m.activations, 1e-9 * m.activations);
    EXPECT_NEAR(mb.buffers - m.buffers, 4.0 * 256 * (100000 - 50257) / t, 1.0);
    // Megatron's GPT stores dropout masks and the fp32 logits.
    const auto meg = input(gpt + std::vector<std::string>{"cluster.implementation=megatron"});
    EXPECT_GT(memory_per_device(meg.w, meg.l, meg.c).activations,
              m.activations + 4 * sb * 50257 / t);
}

TEST(PlanPhysics, Megatron2019Profile) {
    const auto in = input({"cluster.device=V100-32GB", "cluster.implementation=megatron-2019"});
    EXPECT_EQ(in.c.dp_overlap, 0);
    EXPECT_LT(in.c.impl_eff, 0.7);
    EXPECT_EQ(std::string(impl_name(in.c.impl)), "megatron-2019");
}

}  // namespace
}  // namespace apiary::plan
