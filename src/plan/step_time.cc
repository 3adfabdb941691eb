#include "plan/step_time.h"

#include <algorithm>

#include "plan/collectives.h"
#include "plan/memory.h"

namespace apiary::plan {

double gemm_efficiency(const Device& d, double m, double n, double k) {
    // Tiles of a GEMM kernel are ~64-256 wide: a dimension much smaller than
    // that leaves units idle. A saturating factor per dimension captures it
    // with one constant (the knee) that calibrate can fit.
    const double q = d.gemm_knee;
    return d.gemm_eff * (m / (m + q)) * (n / (n + q)) * (k / (k + q));
}

double model_flops_per_step(const Workload& w) {
    return w.model.train_flops_per_token(w.seq_len) * double(w.seq_len) * double(w.global_batch);
}

double recompute_flops_per_step(const Workload& w, Recompute r) {
    const auto& m = w.model;
    const double tokens = double(w.seq_len) * double(w.global_batch);
    // QK^T and AV forward: 2 L T (qk + v widths) per token.
    const double attn_fwd =
        2.0 * m.n_layer * double(w.seq_len) * double(m.qk_width() + m.v_width());
    if (r == Recompute::selective) return w.flash ? 0 : attn_fwd * tokens;
    if (r == Recompute::full) {
        // One more forward of every block (not the LM head).
        const double blocks =
            double(m.num_active_matmul_params()) - double(m.vocab_size) * m.n_embd;
        return (2.0 * blocks + attn_fwd) * tokens;
    }
    return 0;
}

double bubble_fraction(int pp, long long n_micro, int vpp) {
    return double(pp - 1) / (double(std::max(1, vpp)) * double(std::max<long long>(1, n_micro)));
}

namespace {

struct LayerCost {         // seconds for one block and one micro-batch on one device
    double fwd = 0;        // GEMMs + attention + elementwise
    double attn_core = 0;  // the part selective recomputation repeats
    double attn_bwd = 0;   // attention core backward (2x forward; 2.5x fused)
    // Forward and backward together, not scaled like the GEMMs: fp8 casts
    // and the host-bound part of a dropless MoE block.
    double once = 0;
    double cp_comm = 0;  // KV exchange of context parallelism, forward + backward
    double a2a = 0;      // expert all-to-alls, forward + backward
};

// A GEMM's time on the roofline (Williams, Waterman & Patterson 2009): its
// FLOPs at the size-dependent fraction of peak plus the HBM traffic of its
// operands (A and B read once, C written once). The two are added rather
// than overlapped: a small GEMM (a fine-grained expert, a narrow model)
// cannot hide its prologue and epilogue behind math, and for a large one
// the traffic is a few percent that the fitted gemm_eff absorbs. Fused
// attention keeps its tiles on chip, so it is costed without the traffic.
struct Gemm {
    const Device& d;
    double peak, threads;
    double bw = 0;                       // bytes/s for operands; 0: compute only
    double in_bytes = 2, out_bytes = 2;  // fp8 GEMMs read 1-byte operands
    // Seconds of `batch` GEMMs of (mm x kk) @ (kk x nn).
    double operator()(double mm, double nn, double kk, double batch = 1) const {
        double t = 2 * mm * nn * kk / (peak * gemm_efficiency(d, mm / threads, nn, kk));
        if (bw > 0) t += ((mm * kk + kk * nn) * in_bytes + mm * nn * out_bytes) / bw;
        return batch * t;
    }
};

// Kernels a dropless MoE block issues per micro-batch, forward and
// backward. Megatron-Core's all-to-all dispatcher copies the tokens each
// expert received to the host to size the all-to-all and the grouped GEMM
// (a device-to-host synchronisation per MoE layer), so the host cannot run
// ahead of the device: the experts' part of the block takes as long as the
// longer of launching its kernels and running them. Fixed: routing, sort and permute, two
// all-to-alls, unpermute and activation, about 20 forward and 40 backward.
// Per local expert, Transformer Engine's GroupedLinear launches each GEMM on
// its own: 2 forward, 4 backward (data and weight gradients), and with fp8
// as many quantisations again.
constexpr double kMoeFixedKernels = 60;
double moe_host_kernels(double local_experts, bool fp8) {
    return kMoeFixedKernels + local_experts * (fp8 ? 12.0 : 6.0);
}

// Bytes of the fp8 casts of one block, forward and backward: every GEMM
// input is quantised (read 2 bytes, write the fp8 copy and its transpose
// for the weight gradient: 4 bytes per element) and so is every output
// gradient in backward (Micikevicius et al. 2022, "FP8 formats for deep
// learning"; Transformer Engine's cast_transpose). Weights are cast once per
// step and are left out.
double fp8_cast_bytes(double gemm_in_elems, double gemm_out_elems) {
    return 4.0 * (gemm_in_elems + gemm_out_elems);
}

// Context parallelism: each rank receives the other cp - 1 key/value chunks
// in forward, and keys/values plus their gradients in backward (ring
// attention; an all-gather of K and V moves the same bytes). `tok_bytes`:
// the rank's tokens times the bytes of one attention element.
double cp_exchange_s(const Workload& w, const Layout& l, const Cluster& c, double tok_bytes) {
    if (l.cp <= 1) return 0;
    const auto& m = w.model;
    const double kv = m.mla() ? double(m.qk_width() + m.v_width()) : 2.0 * m.kv_dim();
    return 3 * (l.cp - 1) * p2p_s(c, l.tp, tok_bytes * kv / l.tp);
}

// The block's matrix GEMMs (at the training precision, on the roofline) and
// its attention core (16 bits even in fp8 training, Transformer Engine's;
// fused, so compute only). A rank's GEMM is split over its threads by rows.
struct Gemms {
    Gemm gemm, attn;
    Dtype attn_dtype;
};
Gemms block_gemms(const Workload& w, const Cluster& c) {
    const Device& d = c.dev;
    const double threads =
        d.shared_by_ranks ? std::max(1.0, double(d.cores) / double(c.ranks_per_node())) : 1.0;
    const bool f8 = w.dtype == Dtype::fp8;
    const double ab = act_bytes(w.dtype), peak = c.share() * c.impl_eff;
    const double bw = d.mem_bw * d.mem_eff * c.share();
    const Dtype attn_dtype = f8 ? Dtype::bf16 : w.dtype;
    return {
        Gemm{d, d.peak(w.dtype) * peak * (f8 ? d.fp8_eff : 1.0), threads, bw, f8 ? 1.0 : ab, ab},
        Gemm{d, d.peak(attn_dtype) * peak, threads}, attn_dtype};
}

LayerCost layer_cost(const Workload& w, const Layout& l, const Cluster& c, bool experts) {
    const auto& m = w.model;
    const bool f8 = w.dtype == Dtype::fp8;
    const double bw = c.dev.mem_bw * c.dev.mem_eff * c.share(), ab = act_bytes(w.dtype);
    const auto [gemm, attn, attn_dtype] = block_gemms(w, c);
    const double t = l.tp, s = double(w.seq_len) / l.cp, b = l.micro_batch, tok = s * b;
    const double C = m.n_embd, S = w.seq_len, a = double(m.n_head) / t;
    LayerCost lc;
    // Projections in (queries, keys, values, latents) and out.
    const double out_w = double(m.v_width());
    const double in_w = (double(m.attn_params()) - out_w * C) / C;
    double g = gemm(tok, in_w / t, C) + gemm(tok, C, out_w / t);
    double cast_in = tok * (C + out_w / t), cast_out = tok * (in_w / t + C);
    // Scores and weighted sum: 1/cp of the queries against every key.
    // Fused kernels skip the masked half of a causal score matrix.
    const double hq = double(m.qk_width()) / m.n_head, hv = out_w / m.n_head;
    const double causal = w.flash ? 0.5 : 1.0;
    lc.attn_core = causal * (attn(s, S, hq, b * a) + attn(s, hv, S, b * a));
    lc.attn_bwd = (w.flash ? 2.5 : 2.0) * lc.attn_core;
    const double up = m.arch == core::Arch::llama ? 2 : 1;  // SwiGLU: gate and up
    auto mlp = [&](double rows, double width, double batch) {
        cast_in += batch * rows * (C + width / t);
        cast_out += batch * rows * (up * width / t + C);
        return gemm(rows, width / t, C, up * batch) + gemm(rows, C, width / t, batch);
    };
    double bytes_a2a = 0;
    if (!experts) {
        g += mlp(tok, m.ffn_dim(), 1);
    } else {
        // Each rank's experts see, on average, its own share of the routed
        // tokens: tok x k (x capacity) spread over its n_expert / ep experts.
        const double k = double(m.n_expert_active) * w.capacity_factor;
        const double local = double(m.n_expert) / l.ep;
        const double routed =
            gemm(tok, double(m.n_expert), C) + mlp(tok * k / local, m.expert_ffn_dim(), local);
        g += routed;
        if (m.n_shared_expert > 0) g += mlp(tok, double(m.n_shared_expert) * m.expert_ffn_dim(), 1);
        bytes_a2a = tok * k * C * ab / (l.sp ? t : 1.0);
        // The device works while the host launches: only the launch time
        // beyond the routed experts' GEMMs (forward and backward) shows.
        lc.once += std::max(0.0, c.launch_s * moe_host_kernels(local, f8) - 3 * routed);
    }
    if (f8) lc.once += fp8_cast_bytes(cast_in, cast_out) / bw;
    // Elementwise kernels (norms, softmax, activations, dropout, residuals,
    // routing) are memory bound; the bytes they move scale like the
    // activations they store: written in forward, read and their gradients
    // written in backward.
    const double act = block_activation_bytes(w, l, experts, Recompute::none);
    const double elementwise = act / bw;
    lc.fwd = g + lc.attn_core + elementwise;
    // 4 all-to-alls (dispatch and combine, forward and backward).
    if (experts && l.ep > 1) {
        lc.a2a = 4 * all_to_all_s(c, Group{l.ep, (long long)l.tp * l.cp}, bytes_a2a);
    }
    lc.cp_comm = cp_exchange_s(w, l, c, tok * act_bytes(attn_dtype));
    return lc;
}

struct PerMicro {  // seconds per micro-batch on one pipeline stage
    double compute = 0, rec = 0, tp = 0, cp = 0, ep = 0, pp = 0, fwd = 0;
    double total() const { return compute + rec + tp + cp + ep + pp; }
};

// The costs of one dense and one MoE block, computed once for every stage.
struct BlockCosts {
    LayerCost dense, moe;
    double tp_one = 0;  // one tensor-parallel all-reduce of the block's activations
};

BlockCosts block_costs(const Workload& w, const Layout& l, const Cluster& c) {
    const auto& m = w.model;
    BlockCosts bc;
    bc.dense = layer_cost(w, l, c, false);
    if (m.moe()) bc.moe = layer_cost(w, l, c, true);
    const double msg = double(w.seq_len) / l.cp * l.micro_batch * m.n_embd *
                       act_bytes(w.dtype == Dtype::fp8 ? Dtype::bf16 : w.dtype);
    bc.tp_one = all_reduce_s(c, Group{l.tp, 1}, msg, true);
    return bc;
}

// The blocks of one stage (`dense` and `moe` of them) for one micro-batch;
// `ends`: whether the stage holds the embedding and / or the LM head.
PerMicro stage_blocks_time(const Layout& l, const Cluster& c, const BlockCosts& bc, double dense,
                           double moe, int ends, bool flash) {
    auto each = [&](auto f) { return dense * f(bc.dense) + moe * f(bc.moe); };
    PerMicro p;
    // Forward 1x, backward 2x (weight and input gradients); fused attention's
    // backward also recomputes the scores.
    p.fwd = each([](const LayerCost& x) { return x.fwd; });
    p.compute =
        each([](const LayerCost& x) { return 3 * x.fwd - 2 * x.attn_core + x.attn_bwd + x.once; });
    if (l.recompute == Recompute::full) p.rec = p.fwd;
    if (l.recompute == Recompute::selective && (!flash || c.selective_reruns_attention)) {
        p.rec = each([](const LayerCost& x) { return x.attn_core; });
    }
    const double attn_time = each([](const LayerCost& x) { return x.attn_core + x.attn_bwd; });
    p.cp = std::max(0.0,
                    each([](const LayerCost& x) { return x.cp_comm; }) - c.cp_overlap * attn_time);
    p.ep = (1 - c.moe_overlap) * each([](const LayerCost& x) { return x.a2a; });
    // Tensor parallelism: 2 all-reduces in forward and 2 in backward per block
    // (Shoeybi et al. 2019); sequence parallelism swaps each for a
    // reduce-scatter + all-gather of the same volume. Full recomputation
    // repeats the forward ones. Megatron does not overlap them. Plus the
    // vocabulary-parallel embedding's sum in forward and the gradient of the
    // head's input in backward, on the stages that hold them.
    const double blocks = dense + moe;
    p.tp = (blocks * (4 + (l.recompute == Recompute::full ? 2 : 0)) + ends) * bc.tp_one;
    return p;
}

// The token (and position) embedding on the first stage: a memory-bound
// gather of s b rows forward, and in backward the rows' gradients read and
// added into the table's gradient (read and written): 5 passes over s b C
// values per table.
double embed_time(const Workload& w, const Layout& l, const Cluster& c) {
    const Device& d = c.dev;
    const double bw = d.mem_bw * d.mem_eff * c.share();
    const double tables = w.model.arch == core::Arch::gpt2 ? 2 : 1;
    const double tok = double(w.seq_len) / l.cp * l.micro_batch;
    return 5 * tables * tok * w.model.n_embd * act_bytes(w.dtype) / bw;
}

double head_time(const Workload& w, const Layout& l, const Cluster& c) {
    // The LM head (on the last stage): a GEMM of (sb x C) @ (C x V/t), 3 passes,
    // plus the fp32 logits streamed through the fused cross entropy. It stays
    // in 16 bits in fp8 training (Megatron-Core's output layer is not a
    // Transformer Engine layer).
    const Device& d = c.dev;
    const Dtype dt = w.dtype == Dtype::fp8 ? Dtype::bf16 : w.dtype;
    const double bw = d.mem_bw * d.mem_eff * c.share();
    const Gemm gemm{d, d.peak(dt) * c.share() * c.impl_eff, 1.0, bw, act_bytes(dt), act_bytes(dt)};
    const double sb = double(w.seq_len) / l.cp * l.micro_batch;
    const double V = w.model.vocab_size, C = w.model.n_embd;
    return 3 * gemm(sb, V / l.tp, C) + 3 * 4 * sb * V / l.tp / bw;
}

// DP / ZeRO communication of one step, and the part backward cannot hide.
// `pm`: the slowest stage's micro-batch, the one whose backward hides it.
void dp_time(const Workload& w, const Layout& l, const Cluster& c, const StageSplit& split,
             const PerMicro& pm, StepTime& st) {
    const auto& m = w.model;
    const StateBytes sb = state_bytes(w.dtype);
    StageParams p;
    for (int s = 0; s < l.pp; ++s) {
        const StageParams q = stage_param_split(m, l, split, s);
        p.dense = std::max(p.dense, q.dense), p.expert = std::max(p.expert, q.expert);
    }
    // Dense weights are replicated over the dp x cp ranks (stride tp),
    // experts over dp x cp / ep (the ranks ep apart).
    const Group dense{l.dp * l.cp, l.tp}, expert{l.dp * l.cp / l.ep, (long long)l.tp * l.ep};
    const double nm = double(l.n_micro);
    if (l.zero < 3) {
        // ZeRO 0-2 move the same volume as one all-reduce once per step,
        // bucketed behind the last micro-batch's backward. ZeRO 1-2 (and
        // Megatron's distributed optimizer) do it as a reduce-scatter of the
        // gradients and an all-gather of the updated weights: ring only.
        // A ZeRO-2 that reduce-scatters on every micro-step (apiary's) adds
        // a reduce-scatter for each micro-batch before the last.
        const double extra = l.zero == 2 && c.zero2_per_micro ? nm - 1 : 0;
        auto reduce = [&](Group g, double bytes) {
            return l.zero >= 1 ? (2 + extra) * reduce_scatter_s(c, g, bytes)
                               : all_reduce_s(c, g, bytes);
        };
        st.dp_comm = reduce(dense, p.dense * sb.grad) + reduce(expert, p.expert * sb.grad);
        const double window = c.dp_overlap * 2 * pm.fwd;
        st.dp_exposed = std::max(0.0, st.dp_comm - window);
        return;
    }
    // ZeRO-3 gathers the weights in forward and backward and reduce-scatters
    // the gradients on every micro-batch, prefetched behind that
    // micro-batch's compute. `zero3_gathers` collectives per block (1:
    // FSDP's flat parameter per block; DeepSpeed 2021 gathered each
    // parameter tensor), so the ring latency, (n - 1) alpha per collective,
    // is paid 3 x blocks x that.
    const double k = c.zero3_gathers > 0 ? c.zero3_gathers : (m.arch == core::Arch::gpt2 ? 12 : 9);
    const double lp = split.fullest();
    auto three = [&](Group g, double params) {
        return 2 * reduce_scatter_s(c, g, params * sb.weight) +
               reduce_scatter_s(c, g, params * sb.grad);
    };
    const double block = p.dense / lp;
    const double per_mb = lp * k * three(dense, block / k) + three(expert, p.expert);
    st.dp_comm = nm * per_mb;
    const double window = c.dp_overlap * (pm.compute + pm.rec);
    st.dp_exposed = nm * std::max(0.0, per_mb - window);
}

// Whether CPU ranks outnumber the cores they share: then a rank that waits
// (for a pipeline neighbour) gives its core to another.
double oversubscription(const Cluster& c) {
    return c.dev.shared_by_ranks ? double(c.ranks_per_node()) / c.dev.cores : 1.0;
}
bool pooled(const Layout& l, const Cluster& c) { return l.pp > 1 && oversubscription(c) > 1; }

// Seconds per step of a pipeline whose stages take `t[s]` per micro-batch
// (all their chunks, forward and backward): the slowest stage works through
// every micro-batch, and one micro-batch's chunks pass through all the
// others on the way in and out: (m - 1/v) max t + sum t / v. Equal stages
// give m t + (p - 1) t / v, the bubble fraction (p - 1)/(v m) of GPipe
// (Huang et al. 2019), 1F1B (Narayanan et al. 2019) and the interleaved
// schedule (Narayanan et al. 2021).
double pipeline_span(const std::vector<double>& t, double m, double v) {
    double sum = 0, most = 0;
    for (double x : t) sum += x, most = std::max(most, x);
    return (m - 1 / v) * most + sum / v;
}

// The pipeline's idle time per step beyond the average stage's work
// (`busy`): fill and drain, and waiting for the slowest stage. `span`: the
// schedule's length at the stages' own speed (pipeline_span). Pooled, the
// cores go where there is work: the step lasts the longer of `busy` (every
// time here is at a rank's share of the cores) and the schedule at full
// core speed, plus the start and the end, when fewer ranks than cores have
// work (stage 0 runs the first forward alone and the last backward alone).
// `op`: one chunk's forward and backward of one micro-batch.
double pipeline_bubble(const Layout& l, const Cluster& c, double span, double busy, double op) {
    if (l.pp <= 1) return 0;
    if (!pooled(l, c)) return std::max(0.0, span - busy);
    const double over = oversubscription(c), cores = c.dev.cores;
    const double critical = span / over - busy;
    const double per_stage = double(c.ranks_per_node()) / l.pp;
    double ramp = 0;
    for (int k = 1; k < l.pp && k * per_stage < cores; ++k) {
        ramp += (cores - k * per_stage) / cores * op / over;
    }
    return std::max(critical, ramp);
}

// Each stage's time per micro-batch: its blocks, the embedding on the first,
// the LM head and loss on the last, and its point-to-point messages (`p2p`).
std::vector<PerMicro> stage_times(const Workload& w, const Layout& l, const Cluster& c,
                                  const StageSplit& split, double p2p) {
    const BlockCosts bc = block_costs(w, l, c);
    const double head = head_time(w, l, c), embed = embed_time(w, l, c);
    std::vector<PerMicro> out;
    for (int s = 0; s < l.pp; ++s) {
        const bool first = s == 0, last = s == l.pp - 1;
        const double moe = split.moe[size_t(s)], dense = split.blocks[size_t(s)] - moe;
        PerMicro p = stage_blocks_time(l, c, bc, dense, moe, int(first) + int(last), w.flash);
        p.compute += (first ? embed : 0) + (last ? head : 0);
        p.pp = p2p;
        out.push_back(p);
    }
    return out;
}

// Every stage costed on its own (`stages`, per micro-batch); the breakdown
// is the average stage's work, and the bubble what the schedule adds to it
// (the slowest stage sets the pace). Returns the slowest stage.
PerMicro pipeline_time(const Layout& l, const Cluster& c, const std::vector<PerMicro>& stages,
                       double p2p, StepTime& st) {
    const int chunks = l.schedule == PipelineSchedule::interleaved ? l.vpp : 1;
    const double nm = double(l.n_micro), np = double(l.pp);
    std::vector<double> t;
    PerMicro mean, slowest;
    for (const PerMicro& p : stages) {
        t.push_back(p.total());
        mean.compute += p.compute / np, mean.rec += p.rec / np, mean.tp += p.tp / np;
        mean.cp += p.cp / np, mean.ep += p.ep / np;
        if (p.total() >= slowest.total()) slowest = p;
    }
    st.compute = nm * mean.compute;
    st.recompute = nm * mean.rec;
    st.tp_comm = nm * mean.tp;
    st.cp_comm = nm * mean.cp;
    st.ep_comm = nm * mean.ep;
    st.pp_comm = nm * p2p;
    const double busy =
        st.compute + st.recompute + st.tp_comm + st.cp_comm + st.ep_comm + st.pp_comm;
    const double span = pipeline_span(t, nm, chunks);
    const double most = *std::max_element(t.begin(), t.end());
    const double least = *std::min_element(t.begin(), t.end());
    st.bubble = pipeline_bubble(l, c, span, busy, most / chunks);
    if (l.pp > 1) {
        st.bubble_fraction = st.bubble / busy;
        st.stage_idle_max = 1 - nm * least / span;
        for (double x : t) st.stage_busy_s.push_back(nm * x);
    }
    return slowest;
}

}  // namespace

StepTime step_time(const Workload& w, const Layout& l, const Cluster& c) {
    const auto& m = w.model;
    const Device& d = c.dev;
    StepTime st;
    // Pipeline: activations cross each stage boundary once forward and once
    // backward per micro-batch (and per chunk when interleaved); Megatron's
    // scatter/gather sends 1/t of them per rank.
    const int chunks = l.schedule == PipelineSchedule::interleaved ? l.vpp : 1;
    const double wire = c.pp_wire_bytes > 0 ? c.pp_wire_bytes : act_bytes(w.dtype);
    const double pp_msg =
        double(w.seq_len) / l.cp * l.micro_batch * m.n_embd * wire / (c.pp_scatter ? l.tp : 1);
    const long long pp_stride = (long long)l.tp * l.cp * l.dp;
    const double p2p = l.pp > 1 ? 2 * chunks * p2p_s(c, pp_stride, pp_msg) : 0;

    const StageSplit split = stage_split(w, l, c.impl);
    const PerMicro slowest = pipeline_time(l, c, stage_times(w, l, c, split, p2p), p2p, st);
    dp_time(w, l, c, split, slowest, st);

    // AdamW touches each local fp32 master weight, m, v and gradient: about
    // 32 bytes per parameter in mixed precision, 28 in fp32.
    const StateBytes sb = state_bytes(w.dtype);
    const double shard = l.zero >= 1 ? double(l.dp) * l.cp : 1.0;
    const double opt_params = stage_params_per_device(m, l, split) / shard;
    const double opt_bytes = (sb.optimizer == 12 ? 32.0 : 28.0) * opt_params;
    st.optimizer = opt_bytes / (d.mem_bw * d.mem_eff * c.share());

    st.total = st.compute + st.recompute + st.tp_comm + st.cp_comm + st.ep_comm + st.pp_comm +
               st.bubble + st.dp_exposed + st.optimizer;
    st.model_flops = model_flops_per_step(w);
    st.hw_flops = st.model_flops + recompute_flops_per_step(w, l.recompute);
    const double devs = double(l.devices());
    st.tokens_per_s = double(w.global_batch) * w.seq_len / st.total;
    st.tflops_per_device = st.model_flops / st.total / devs / 1e12;
    const double cluster_peak = d.peak(w.dtype) * (d.shared_by_ranks ? 1.0 : devs) *
                                (d.shared_by_ranks ? double(c.nodes()) : 1.0);
    st.mfu = st.model_flops / st.total / cluster_peak;
    st.hfu = st.hw_flops / st.total / cluster_peak;
    return st;
}

}  // namespace apiary::plan
