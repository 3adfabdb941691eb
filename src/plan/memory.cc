#include "plan/memory.h"

#include <algorithm>

namespace apiary::plan {

namespace {
bool mixed(Dtype d) { return d != Dtype::fp32 && d != Dtype::tf32; }
}  // namespace

StateBytes state_bytes(Dtype dtype) {
    if (mixed(dtype)) return {2, 2, 12};
    return {4, 4, 8};
}

double act_bytes(Dtype dtype) { return mixed(dtype) ? 2 : 4; }

double layer_params(const core::ModelSpec& m) {
    core::ModelSpec one = m, none = m;
    one.n_layer = 1, none.n_layer = 0;
    return double(one.num_params() - none.num_params());
}

double embed_params(const core::ModelSpec& m) {
    double e = double(m.vocab_size) * m.n_embd;
    if (m.arch == core::Arch::gpt2) e += double(m.max_seq_len) * m.n_embd;
    return e;
}

double head_params(const core::ModelSpec& m) {
    core::ModelSpec none = m;
    none.n_layer = 0;
    return double(none.num_params()) - embed_params(m);
}

double zero_model_state_bytes(double params, long long dp, int stage, Dtype dtype) {
    const StateBytes b = state_bytes(dtype);
    const double n = double(dp);
    return params * (b.weight / (stage >= 3 ? n : 1) + b.grad / (stage >= 2 ? n : 1) +
                     b.optimizer / (stage >= 1 ? n : 1));
}

double layer_activation_bytes(const core::ModelSpec& m, int seq_len, int micro_batch, int tp,
                              bool sp, Recompute r, Dtype dtype) {
    // Korthikanti et al. 2022, Table 2, per layer with 16-bit activations and
    // 1-byte dropout masks: sbh(10 + 24/t + 5as/(ht)) without sequence
    // parallelism, sbh(34/t + 5as/(ht)) with it; selective recomputation drops
    // the 5as/(ht) attention term; full recomputation keeps only the block
    // input, 2sbh (2sbh/t with sequence parallelism). fp32 doubles the
    // tensors (the masks are a small part, so the whole is scaled).
    const double s = seq_len, b = micro_batch, h = m.n_embd, a = m.n_head, t = tp;
    const double sbh = s * b * h;
    const double scale = act_bytes(dtype) / 2.0;
    if (r == Recompute::full) return scale * (sp ? 2 * sbh / t : 2 * sbh);
    const double linear = sp ? 34.0 / t : 10.0 + 24.0 / t;
    const double attn = r == Recompute::selective ? 0.0 : 5.0 * a * s / (h * t);
    return scale * sbh * (linear + attn);
}

double stage_layers(const core::ModelSpec& m, const Layout& l) {
    return double((m.n_layer + l.pp - 1) / l.pp);
}

namespace {

// Parameters on one device of stage `stage` (0 .. pp-1).
double stage_params(const core::ModelSpec& m, const Layout& l, int stage) {
    const double lp = stage_layers(m, l);
    double p = lp * layer_params(m);
    const bool first = stage == 0, last = stage == l.pp - 1;
    if (first) p += embed_params(m);
    if (last) {
        p += head_params(m);
        // A tied LM head on another stage than the embedding keeps its own
        // copy (Megatron-LM: the embedding is replicated on the last stage).
        if (m.tie_embeddings && !first) p += double(m.vocab_size) * m.n_embd;
    }
    return p / l.tp;
}

long long in_flight(const Layout& l, int stage) {
    // Micro-batches whose activations a stage holds at its peak: GPipe keeps
    // all of them; 1F1B keeps pp - stage; interleaving adds (p-1)/(p v) of
    // a pipeline's worth (Narayanan et al. 2021, Korthikanti et al. 2022).
    if (l.schedule == Schedule::gpipe) return l.n_micro;
    const long long k = std::min<long long>(l.pp - stage, l.n_micro);
    return k;
}

Memory stage_memory(const Workload& w, const Layout& l, const Cluster& c, int stage) {
    const auto& m = w.model;
    const StateBytes sb = state_bytes(w.dtype);
    const double dp = double(l.dp);
    const double p = stage_params(m, l, stage);
    Memory mem;
    mem.params = p * sb.weight / (l.zero >= 3 ? dp : 1);
    mem.grads = p * sb.grad / (l.zero >= 2 ? dp : 1);
    mem.optimizer = p * sb.optimizer / (l.zero >= 1 ? dp : 1);

    const double lp = stage_layers(m, l);
    const double per_layer =
        layer_activation_bytes(m, w.seq_len, l.micro_batch, l.tp, l.sp, l.recompute, w.dtype);
    double mult = double(in_flight(l, stage));
    if (l.schedule == Schedule::interleaved && l.vpp > 1) {
        mult = std::min<double>(mult * (1.0 + double(l.pp - 1) / (double(l.pp) * l.vpp)),
                                double(l.n_micro));
    }
    const double sbh = double(w.seq_len) * l.micro_batch * m.n_embd;
    const double ab = act_bytes(w.dtype);
    double act = lp * per_layer * mult;
    // Full recomputation re-materialises one block at a time in backward.
    if (l.recompute == Recompute::full) {
        act += layer_activation_bytes(m, w.seq_len, l.micro_batch, l.tp, l.sp, Recompute::none,
                                      w.dtype);
    }
    // Embedding dropout mask per micro-batch in flight (Korthikanti eq. 5:
    // sbhp/t) and, on the last stage, the LM head input and fp32 logits for
    // the cross entropy (4sbh/t + 4sbV/t).
    if (stage == 0) act += sbh * mult / l.tp;
    if (stage == l.pp - 1) {
        act += (2 * sbh * ab + 4.0 * w.seq_len * l.micro_batch * double(m.vocab_size)) / l.tp;
    }
    mem.activations = act;

    double buf = c.dev.reserved_bytes;
    if (l.dp > 1 && l.zero < 3) buf += std::min(p, 40e6) * 4;        // one fp32 DP bucket
    if (l.zero >= 3) buf += 2 * layer_params(m) / l.tp * sb.weight;  // gathered + prefetched
    if (l.tp > 1) buf += 2 * sbh * ab;  // TP all-gather / all-reduce staging
    mem.buffers = buf;
    mem.capacity = c.dev.mem_bytes / (c.dev.shared_by_ranks ? double(c.ranks_per_node()) : 1.0);
    return mem;
}

}  // namespace

double stage_params_per_device(const core::ModelSpec& m, const Layout& l) {
    double best = 0;
    for (int s : {0, l.pp - 1}) best = std::max(best, stage_params(m, l, s));
    return best;
}

Memory memory_per_device(const Workload& w, const Layout& l, const Cluster& c) {
    Memory first = stage_memory(w, l, c, 0);
    if (l.pp == 1) return first;
    Memory last = stage_memory(w, l, c, l.pp - 1);
    return last.total() > first.total() ? last : first;
}

}  // namespace apiary::plan
