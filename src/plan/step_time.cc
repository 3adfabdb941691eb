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
    const double attn_fwd = 4.0 * m.n_layer * double(w.seq_len) * m.n_embd;  // QK^T and AV
    if (r == Recompute::selective) return attn_fwd * tokens;
    if (r == Recompute::full) {
        // One more forward of every block (not the LM head).
        const double block_matmul = double(m.num_matmul_params()) - double(m.vocab_size) * m.n_embd;
        return (2.0 * block_matmul + attn_fwd) * tokens;
    }
    return 0;
}

double bubble_fraction(int pp, long long n_micro, int vpp) {
    return double(pp - 1) / (double(std::max(1, vpp)) * double(std::max<long long>(1, n_micro)));
}

namespace {

struct LayerCost {         // seconds for one block and one micro-batch on one device
    double fwd = 0;        // GEMMs + elementwise
    double attn_core = 0;  // the part selective recomputation repeats
    double elementwise = 0;
};

LayerCost layer_cost(const Workload& w, const Layout& l, const Cluster& c) {
    const auto& m = w.model;
    const Device& d = c.dev;
    const double peak = d.peak(w.dtype) * c.share();
    const double t = l.tp, s = w.seq_len, b = l.micro_batch, tok = s * b;
    const double C = m.n_embd, KV = m.kv_dim(), F = m.ffn_dim(), HS = m.head_size();
    // A rank's GEMM is split over its threads by rows: each thread sees m/threads.
    const double threads =
        d.shared_by_ranks ? std::max(1.0, double(d.cores) / double(c.ranks_per_node())) : 1.0;
    auto gemm = [&](double mm, double nn, double kk, double batch) {
        return batch * 2 * mm * nn * kk / (peak * gemm_efficiency(d, mm / threads, nn, kk));
    };
    LayerCost lc;
    double g = gemm(tok, (C + 2 * KV) / t, C, 1);           // QKV
    lc.attn_core = gemm(s, s, HS, b * m.n_head / t)         // scores
                   + gemm(s, HS, s, b * m.n_head / t);      // weighted sum
    g += gemm(tok, C, C / t, 1);                            // output projection
    const double up = m.arch == core::Arch::llama ? 2 : 1;  // SwiGLU: gate and up
    g += gemm(tok, F / t, C, up) + gemm(tok, C, F / t, 1);  // MLP
    // Elementwise kernels (norms, softmax, GeLU/SiLU, dropout, residuals) are
    // memory bound; the bytes they move scale like the activations they store
    // (Korthikanti Table 2, no recompute): written in forward, read and their
    // gradients written in backward.
    const double act =
        layer_activation_bytes(m, w.seq_len, l.micro_batch, l.tp, l.sp, Recompute::none, w.dtype);
    lc.elementwise = act / (d.mem_bw * d.mem_eff * c.share());
    lc.fwd = g + lc.attn_core + lc.elementwise;
    return lc;
}

}  // namespace

StepTime step_time(const Workload& w, const Layout& l, const Cluster& c) {
    const auto& m = w.model;
    const Device& d = c.dev;
    StepTime st;
    const LayerCost lc = layer_cost(w, l, c);
    const double lp = stage_layers(m, l);
    const double s = w.seq_len, b = l.micro_batch;
    const double ab = act_bytes(w.dtype);
    const double peak = d.peak(w.dtype) * c.share();

    // Forward 1x, backward 2x (weight and input gradients).
    double fwd_bwd = 3 * lc.fwd;
    double rec = 0;
    if (l.recompute == Recompute::full) rec = lc.fwd;
    if (l.recompute == Recompute::selective) rec = lc.attn_core;
    // Tensor parallelism: 2 all-reduces in forward and 2 in backward per block
    // (Shoeybi et al. 2019); sequence parallelism swaps each for a
    // reduce-scatter + all-gather of the same volume. Full recomputation
    // repeats the forward ones. Megatron does not overlap them.
    const double tp_msg = s * b * m.n_embd * ab;
    const double tp_one = all_reduce_s(c, Group{l.tp, 1}, tp_msg);
    const double tp_per_layer = tp_one * (4 + (l.recompute == Recompute::full ? 2 : 0));
    // The LM head (on the last stage): a GEMM of (sb x C) @ (C x V/t), 3 passes,
    // plus the fp32 logits streamed through the fused cross entropy.
    const double V = m.vocab_size, C = m.n_embd;
    const double head =
        3 * 2 * s * b * C * V / l.tp / (peak * gemm_efficiency(d, s * b, V / l.tp, C)) +
        3 * 4 * s * b * V / l.tp / (d.mem_bw * d.mem_eff * c.share());
    // Pipeline: activations cross each stage boundary once forward and once
    // backward per micro-batch (and per chunk when interleaved); Megatron's
    // scatter/gather sends 1/t of them per rank.
    const int chunks = l.schedule == Schedule::interleaved ? l.vpp : 1;
    const double pp_msg = s * b * m.n_embd * ab / l.tp;
    const double p2p = l.pp > 1 ? 2 * chunks * p2p_s(c, l.tp, pp_msg) : 0;

    const double per_mb_compute = lp * fwd_bwd + head;
    const double per_mb_rec = lp * rec;
    const double per_mb_tp = lp * tp_per_layer;
    const double t_mb = per_mb_compute + per_mb_rec + per_mb_tp + p2p;
    const double nm = double(l.n_micro);
    st.bubble_fraction = l.pp > 1 ? bubble_fraction(l.pp, l.n_micro, chunks) : 0;
    st.compute = nm * per_mb_compute;
    st.recompute = nm * per_mb_rec;
    st.tp_comm = nm * per_mb_tp;
    st.pp_comm = nm * p2p;
    st.bubble = st.bubble_fraction * nm * t_mb;

    // Data parallelism over the stage's parameters. ZeRO 0-2 move the same
    // volume as one all-reduce (reduce-scatter + all-gather) once per step,
    // bucketed behind the last micro-batch's backward. ZeRO-3 gathers the
    // weights in forward and backward and reduce-scatters the gradients on
    // every micro-batch, prefetched behind that micro-batch's compute.
    const double p_dev = stage_params_per_device(m, l);
    const StateBytes sb = state_bytes(w.dtype);
    const Group dpg{l.dp, (long long)l.tp * l.pp};
    if (l.zero < 3) {
        st.dp_comm = all_reduce_s(c, dpg, p_dev * sb.grad);
        const double window = c.dp_overlap * lp * 2 * lc.fwd;
        st.dp_exposed = std::max(0.0, st.dp_comm - window);
    } else {
        // `zero3_gathers` collectives per block (1: FSDP's flat parameter per
        // block; DeepSpeed 2021 gathered each parameter tensor), so the ring
        // latency, (n - 1) alpha per collective, is paid 3 x blocks x that.
        const double k = std::max(1, c.zero3_gathers);
        const double block = layer_params(m) / l.tp;
        const double rest = std::max(0.0, p_dev - lp * block);
        auto three = [&](double params) {
            return 2 * reduce_scatter_s(c, dpg, params * sb.weight) +
                   reduce_scatter_s(c, dpg, params * sb.grad);
        };
        const double per_mb = lp * k * three(block / k) + three(rest);
        st.dp_comm = nm * per_mb;
        const double window = c.dp_overlap * (per_mb_compute + per_mb_rec);
        st.dp_exposed = nm * std::max(0.0, per_mb - window);
    }
    // AdamW touches each local fp32 master weight, m, v and gradient: about
    // 32 bytes per parameter in mixed precision, 28 in fp32.
    const double opt_params = p_dev / (l.zero >= 1 ? double(l.dp) : 1.0);
    const double opt_bytes = (sb.optimizer == 12 ? 32.0 : 28.0) * opt_params;
    st.optimizer = opt_bytes / (d.mem_bw * d.mem_eff * c.share());

    st.total = st.compute + st.recompute + st.tp_comm + st.pp_comm + st.bubble + st.dp_exposed +
               st.optimizer;
    st.model_flops = model_flops_per_step(w);
    st.hw_flops = st.model_flops + recompute_flops_per_step(w, l.recompute);
    const double devs = double(l.devices());
    st.tokens_per_s = double(w.global_batch) * s / st.total;
    st.tflops_per_device = st.model_flops / st.total / devs / 1e12;
    const double cluster_peak = d.peak(w.dtype) * (d.shared_by_ranks ? 1.0 : devs) *
                                (d.shared_by_ranks ? double(c.nodes()) : 1.0);
    st.mfu = st.model_flops / st.total / cluster_peak;
    st.hfu = st.hw_flops / st.total / cluster_peak;
    return st;
}

}  // namespace apiary::plan
