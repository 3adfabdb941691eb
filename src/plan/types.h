#pragma once
// What the planner reasons about: a model and batch (Workload), a parallel
// layout (Layout) and a resolved cluster (Cluster), and what it predicts
// (Memory, StepTime, Totals). Plain structs so that the search can evaluate
// a hundred thousand layouts a second.

#include <string>
#include <vector>

#include "core/model_spec.h"
#include "core/parallelism.h"
#include "plan/catalog.h"

namespace apiary::plan {

using core::PipelineSchedule;  // core/parallelism.h, shared with the trainer
using core::Recompute;
enum class Algo { automatic, ring, tree, hierarchical };
// The software stack that runs the layout (cluster.implementation): what
// overlaps, how ZeRO-3 gathers and how pipeline activations travel differ.
enum class Impl { megatron, megatron2019, deepspeed, fsdp, apiary };

const char* algo_name(Algo a);
Algo parse_algo(const std::string& s);
const char* impl_name(Impl i);
Impl parse_impl(const std::string& s);

struct Workload {
    core::ModelSpec model;
    int seq_len = 2048;          // T
    Dtype dtype = Dtype::bf16;   // compute precision; bf16/fp16/fp8 train in mixed precision
    long long global_batch = 1;  // sequences per optimizer step
    double tokens = 0;           // tokens to train on (0: no run totals)
    // Fused attention (FlashAttention, Dao et al. 2022): the s x s scores are
    // never stored, the causal half is skipped and backward recomputes them.
    bool flash = true;
    // Tokens an expert computes relative to an even split: GShard / Switch
    // pad to the capacity; a dropless router sees its load imbalance.
    double capacity_factor = 1.0;
    // Dropout masks are stored (Megatron's GPT); apiary's trainer has no
    // dropout, so its blocks keep none.
    bool dropout = true;
};

struct Layout {
    int tp = 1;
    int pp = 1;
    long long dp = 1;
    int cp = 1;    // context parallel: each rank holds 1/cp of every sequence
    int ep = 1;    // expert parallel: experts sharded over ep of the dp ranks
    int zero = 0;  // ZeRO stage 0-3, sharded over dp
    Recompute recompute = Recompute::none;
    bool sp = false;        // sequence parallel (Korthikanti et al. 2022)
    int micro_batch = 1;    // b, sequences per micro-batch
    long long n_micro = 1;  // micro-batches per optimizer step per pipeline
    PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
    int vpp = 1;  // model chunks per stage (interleaved schedule)
    // Blocks of each virtual stage, in the trainer's order (chunk c of stage s
    // is virtual stage c pp + s): parallel.stage_layers. Empty: the
    // implementation's own split (stage_split in plan/memory.h).
    std::vector<int> stage_layers;
    // Ranks are ordered tp, cp, dp (ep its inner part), pp, tp fastest: the
    // rank order of core/parallelism.h, which the trainer's mesh uses too.
    long long devices() const { return (long long)tp * cp * pp * dp; }
};

struct Cluster {
    Device dev;       // catalog entry with overrides and calibration applied
    long long n = 1;  // devices
    Link intra, inter;
    Topology topo;
    Algo algo = Algo::automatic;
    double dp_overlap = 1.0;  // fraction of a backward pass that can hide DP comm
    int zero3_gathers = 1;    // ZeRO-3 collectives per block per direction
    Impl impl = Impl::megatron;
    // Fraction of the catalog's GEMM efficiency the implementation reaches
    // (fitted per profile on the validation set's fit split).
    double impl_eff = 1.0;
    bool pp_scatter = true;    // pipeline sends 1/tp of the activations per rank
    double pp_wire_bytes = 0;  // bytes per activation element between stages (0: act_bytes)
    // ZeRO-2 reduce-scatters the gradients on every micro-step (else once per step).
    bool zero2_per_micro = false;
    // Selective recomputation reruns the attention core's forward even with
    // fused attention: its output and log-sum-exp are not kept (apiary).
    bool selective_reruns_attention = false;
    double moe_overlap = 0.0;  // fraction of expert all-to-all hidden behind compute
    double cp_overlap = 1.0;   // fraction of context-parallel KV exchange hidden
    // Host time to launch one kernel (framework dispatch + driver): exposed
    // where the host must wait for the device, as a dropless MoE block does.
    double launch_s = 0;
    // The LM head's cross entropy is fused and vocabulary-parallel
    // (Megatron-LM); unfused, bf16 logits, their fp32 copy and its gradient
    // coexist.
    bool fused_ce = true;
    // Rows of logits the LM head holds at a time, alone and vocabulary
    // parallel (0: every row's, kept until backward). apiary's trainer
    // computes loss and gradient per block of rows in a scratch buffer
    // (src/kernels/cpu/cross_entropy.cc, tensor_parallel.cc).
    double head_rows = 0, head_rows_tp = 0;
    // One block's fp32 activation gradients are kept as scratch per stage
    // (apiary's backward buffers, src/model/stage.cc).
    bool grad_scratch = false;
    // Bytes the caching allocator reserves per byte of activations beyond
    // what is live (PyTorch's allocator splits and caches blocks).
    double alloc_frac = 0;
    // Energy and emissions.
    double pue = 1.1;
    double idle_frac = 0.3;  // device power at idle as a fraction of TDP
    double network_w_per_device = 30;
    double gco2_per_kwh = 400;
    std::vector<double> gco2_profile;  // hourly, repeats; empty: the constant
    double start_hour = 0;
    // Cost and reliability.
    double price_hour = 0, spot_price_hour = 0;
    bool spot = false;
    double spot_preempt_per_node_hour = 0.05;
    double mtbf_node_hours = 50000;
    double ckpt_write_s = 0;  // 0: checkpoint bytes / ckpt_bw
    double ckpt_bw = 5e9;     // bytes/s per device to storage
    double restart_s = 600;

    long long nodes() const;
    long long ranks_per_node() const;
    // Per-rank share of compute and memory bandwidth (CPU ranks share cores).
    double share() const;
};

struct Memory {  // bytes per device, on the fullest pipeline stage
    double params = 0, grads = 0, optimizer = 0, activations = 0, buffers = 0;
    // Held by the caching allocator beyond the live tensors (fragmentation).
    double allocator = 0;
    // The runtime's own (CUDA context and library workspaces; a CPU rank's
    // MPI and thread runtime): outside what the training code allocates.
    double runtime = 0;
    double total() const {
        return params + grads + optimizer + activations + buffers + allocator + runtime;
    }
    double capacity = 0;
    bool fits() const { return total() <= capacity; }
};

struct StepTime {          // seconds per optimizer step
    double compute = 0;    // forward + backward GEMMs and elementwise, all micro-batches
    double recompute = 0;  // re-running forward for recomputation
    double tp_comm = 0;
    double cp_comm = 0;  // context-parallel KV exchange not hidden behind attention
    double ep_comm = 0;  // expert all-to-all not hidden
    double pp_comm = 0;
    double bubble = 0;      // pipeline fill and drain
    double dp_comm = 0;     // total DP / ZeRO communication
    double dp_exposed = 0;  // the part not hidden behind backward
    double optimizer = 0;
    double total = 0;
    // The pipeline's idle time over the average stage's work: (p - 1) / (v m)
    // for equal stages, more when one stage (the head's) is slower.
    double bubble_fraction = 0;
    // Share of the schedule's span that its least busy stage idles (what
    // `apiary bench parallel` replays from measured op times as its bubble).
    double stage_idle_max = 0;
    std::vector<double> stage_busy_s;  // each stage's work per step (pipeline only)
    double model_flops = 0;            // per step, whole cluster
    double hw_flops = 0;               // with recomputation
    double tokens_per_s = 0;
    double tflops_per_device = 0;  // model FLOPs
    double mfu = 0, hfu = 0;
};

struct Totals {
    double steps = 0;
    double ideal_s = 0;          // steps x step time, no failures
    double goodput = 1;          // useful fraction of wall time
    double ckpt_interval_s = 0;  // Young/Daly
    double wall_s = 0;
    double gpu_hours = 0;
    double cost_usd = 0;  // on demand, or spot if cluster.spot
    double cost_on_demand_usd = 0, cost_spot_usd = 0, spot_wall_s = 0;
    double power_kw = 0;  // whole cluster at the wall, PUE included
    double energy_kwh = 0;
    double co2e_t = 0;
    double best_start_hour = 0;  // with an hourly profile
    double best_co2e_t = 0;
};

}  // namespace apiary::plan
