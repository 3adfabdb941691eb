#include "plan/memory.h"

#include <algorithm>
#include <utility>

#include "core/stage_split.h"

namespace apiary::plan {

namespace {
bool mixed(Dtype d) { return d != Dtype::fp32 && d != Dtype::tf32; }
bool gpt(const core::ModelSpec& m) { return m.arch == core::Arch::gpt2; }
}  // namespace

StateBytes state_bytes(Dtype dtype) {
    if (mixed(dtype)) return {2, 2, 12};
    return {4, 4, 8};
}

double act_bytes(Dtype dtype) { return mixed(dtype) ? 2 : 4; }

double embed_params(const core::ModelSpec& m) {
    double e = double(m.vocab_size) * m.n_embd;
    if (m.arch == core::Arch::gpt2) e += double(m.max_seq_len) * m.n_embd;
    return e;
}

double head_params(const core::ModelSpec& m) {
    const double norm = m.arch == core::Arch::gpt2 ? 2.0 * m.n_embd : double(m.n_embd);
    return norm + (m.tie_embeddings ? 0.0 : double(m.vocab_size) * m.n_embd);
}

double layer_params(const core::ModelSpec& m) {
    return (double(m.num_params()) - embed_params(m) - head_params(m)) / m.n_layer;
}

double expert_params(const core::ModelSpec& m) {
    return m.moe() ? double(m.mlp_params(m.expert_ffn_dim())) : 0.0;
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

double block_activation_bytes(const Workload& w, const Layout& l, bool experts, Recompute r) {
    const auto& m = w.model;
    const bool gpt = m.arch == core::Arch::gpt2;  // GeLU
    const bool masks = gpt && w.dropout;          // dropout masks (GPT)
    const double s = double(w.seq_len) / l.cp, b = l.micro_batch, h = m.n_embd, t = l.tp;
    const double sb = s * b, sbh = sb * h, scale = act_bytes(w.dtype) / 2.0;
    const double rep = l.sp ? t : 1.0;                       // replicated tensors shard with SP
    if (r == Recompute::full) return scale * 2 * sbh / rep;  // the block input
    // Norm inputs, QKV and MLP inputs (2 bytes each), dropout masks (1 byte).
    double bytes = (8 + (masks ? 2 : 0)) * sbh / rep;
    // Q, K, V and the attention output (input of the output projection).
    const double kv = m.mla() ? double(m.qk_width() + m.v_width()) : 2.0 * m.kv_dim();
    bytes += 2 * sb * (double(m.qk_width()) + kv + double(m.v_width())) / t;
    const double a = m.n_head;
    // fp32 log-sum-exp per row, 4 bytes whatever the precision (not scaled).
    const double lse = w.flash ? 4 * a * sb / t : 0.0;
    if (!w.flash && r != Recompute::selective) {
        // Softmax output, and with dropout its mask and output: 5as^2b (GPT).
        bytes += (masks ? 5.0 : 2.0) * a * s * s * b / t;
    }
    const double act = gpt ? 4 : 6;  // GeLU: in, out; SwiGLU: gate, up, product
    if (!experts) return scale * (bytes + act * sb * double(m.ffn_dim()) / t) + lse;
    // Routed experts: k copies of each token (x capacity), their inputs and
    // outputs and intermediate activations; shared experts; fp32 router logits.
    const double k = double(m.n_expert_active) * w.capacity_factor;
    const double fe = m.expert_ffn_dim();
    bytes += 2 * 2 * sbh * k / rep + act * sb * fe * (k + m.n_shared_expert) / t;
    bytes += 4 * sb * double(m.n_expert);
    return scale * bytes + lse;
}

std::vector<int> virtual_stage_layers(const Workload& w, const Layout& l, Impl impl) {
    if (!l.stage_layers.empty()) return l.stage_layers;
    const int L = w.model.n_layer;
    const int parts = l.pp * (l.schedule == PipelineSchedule::interleaved ? std::max(1, l.vpp) : 1);
    if (impl == Impl::apiary && parts == l.pp) {
        return core::balanced_stage_layers(w.model, parts, w.seq_len);
    }
    // ceil(L / parts) blocks per virtual stage in order, the remainder
    // (at least a block each) on the last ones, which hold the head.
    std::vector<int> counts;
    const int per = (L + parts - 1) / parts;
    for (int k = 0, left = L; k < parts; ++k) {
        counts.push_back(std::max(1, std::min(per, left - (parts - 1 - k))));
        left -= counts.back();
    }
    return counts;
}

int StageSplit::fullest() const { return *std::max_element(blocks.begin(), blocks.end()); }

StageSplit stage_split(const Workload& w, const Layout& l, Impl impl) {
    const auto& m = w.model;
    const std::vector<int> counts = virtual_stage_layers(w, l, impl);
    StageSplit out;
    out.blocks.assign(size_t(l.pp), 0);
    out.moe.assign(size_t(l.pp), 0);
    int first = 0;
    for (size_t k = 0; k < counts.size(); ++k) {
        const size_t stage = k % size_t(l.pp);
        const int last = first + counts[k];
        out.blocks[stage] += counts[k];
        if (m.moe()) out.moe[stage] += std::max(0, last - std::max(first, m.moe_dense_layers));
        first = last;
    }
    return out;
}

StageParams stage_param_split(const core::ModelSpec& m, const Layout& l, const StageSplit& split,
                              int stage) {
    const int blocks = split.blocks[size_t(stage)], moe = split.moe[size_t(stage)];
    StageParams p;
    if (m.moe()) {
        // Each block by its kind: a dense MLP, or router + shared experts.
        const double attn = double(m.attn_params()) + 2.0 * m.n_embd;  // + norms
        const double dense = attn + double(m.mlp_params(m.ffn_dim()));
        const double shared =
            attn + double(m.n_embd) * m.n_expert + m.n_shared_expert * expert_params(m);
        p.dense = (blocks - moe) * dense + moe * shared;
        p.expert = moe * m.n_expert * expert_params(m) / l.ep;
    } else {
        p.dense = blocks * layer_params(m);
    }
    const bool first = stage == 0, last = stage == l.pp - 1;
    if (first) p.dense += embed_params(m);
    if (last) {
        p.dense += head_params(m);
        // A tied LM head on another stage than the embedding keeps its own
        // copy (Megatron-LM: the embedding is replicated on the last stage).
        if (m.tie_embeddings && !first) p.dense += double(m.vocab_size) * m.n_embd;
    }
    p.dense /= l.tp, p.expert /= l.tp;
    return p;
}

namespace {

long long in_flight(const Layout& l, int stage) {
    // Micro-batches whose activations a stage holds at its peak: GPipe keeps
    // all of them; 1F1B keeps pp - stage; interleaving adds (p-1)/(p v) of
    // a pipeline's worth (Narayanan et al. 2021, Korthikanti et al. 2022).
    if (l.schedule == PipelineSchedule::gpipe) return l.n_micro;
    return std::min<long long>(l.pp - stage, l.n_micro);
}

// Activations of the stage's blocks for one micro-batch, and the largest
// single block (what full recomputation re-materialises at a time).
std::pair<double, double> stage_block_activations(const Workload& w, const Layout& l,
                                                  const StageSplit& split, int stage) {
    const int blocks = split.blocks[size_t(stage)], moe = split.moe[size_t(stage)];
    const double dense = block_activation_bytes(w, l, false, l.recompute);
    const double routed = moe > 0 ? block_activation_bytes(w, l, true, l.recompute) : 0.0;
    const double peak = std::max(block_activation_bytes(w, l, false, Recompute::none),
                                 moe > 0 ? block_activation_bytes(w, l, true, Recompute::none) : 0);
    return {(blocks - moe) * dense + moe * routed, peak};
}

// What apiary's ZeRO-3 holds beside the shards (parallel/zero.h,
// ShardedStore): lent buffers for the stage's embedding unit, its final unit
// and two blocks (W parameters), once for the parameters (fp32, and a bf16
// model's 16-bit copy) and once for the gradients (fp32, and this rank's
// piece of each as the reduce-scatter's output); the embedding and final
// units stay lent through the step. Plus the MPI engine's scratch for a
// ring reduce-scatter, which runs in pieces of at most 16 MiB over all
// ranks (comm::kCollectivePieceBytes): two chunks of one piece in flight.
double apiary_zero3_buffers(const Workload& w, const Layout& l, int stage) {
    const auto& m = w.model;
    const bool first = stage == 0, last = stage == l.pp - 1;
    const double embed = first ? embed_params(m) / l.tp : 0.0;
    double final = 0;
    if (last) {
        final = head_params(m);
        if (m.tie_embeddings && !first) final += double(m.vocab_size) * m.n_embd;
        final /= l.tp;
    }
    const double block = layer_params(m) / l.tp;
    const double lent = embed + final + 2 * block;
    const double d = double(l.dp) * l.cp;
    const double param_bytes = mixed(w.dtype) ? 4.0 + 2.0 : 4.0;
    const double grad_bytes = 4.0 + 4.0 / d;
    constexpr double kPieceBytes = 16.0 * 1048576.0;
    const double largest_piece = std::max({embed, final, block}) / d;
    const double ring = d > 1 ? 2 * 4 * std::min(largest_piece, kPieceBytes / 4 / d) : 0.0;
    return lent * (param_bytes + grad_bytes) + ring;
}

// Scratch the trainer keeps per stage (Cluster::head_rows, grad_scratch):
// the fp32 logits of one block of rows on the last stage, and one block's
// activation gradients (residual, norm output, QKV, attention output, MLP
// input and activation, src/model/stage.cc).
double scratch_bytes(const Workload& w, const Layout& l, const Cluster& c, int stage) {
    const auto& m = w.model;
    const double rows = double(w.seq_len) / l.cp * l.micro_batch, t = l.tp;
    double bytes = 0;
    if (stage == l.pp - 1 && c.head_rows > 0) {
        bytes += 4 * std::min(rows, l.tp > 1 ? c.head_rows_tp : c.head_rows) * m.vocab_size / t;
    }
    if (c.grad_scratch) {
        const double C = m.n_embd, F = m.ffn_dim();
        const double qkv = double(m.qk_width()) + 2.0 * m.kv_dim(), up = gpt(m) ? F : 2 * F;
        bytes += 4 * rows * (2 * C + (qkv + double(m.v_width()) + up + F) / t);
    }
    return bytes;
}

Memory stage_memory(const Workload& w, const Layout& l, const Cluster& c, const StageSplit& split,
                    int stage) {
    const auto& m = w.model;
    const StateBytes sb = state_bytes(w.dtype);
    // Dense weights are replicated over dp x cp ranks, experts over dp x cp / ep.
    const double d = double(l.dp) * l.cp, de = d / l.ep;
    const StageParams p = stage_param_split(m, l, split, stage);
    auto shard = [&](double bytes, int from) {
        return bytes * (p.dense / (l.zero >= from ? d : 1) + p.expert / (l.zero >= from ? de : 1));
    };
    Memory mem;
    mem.params = shard(sb.weight, 3);
    mem.grads = shard(sb.grad, 2);
    mem.optimizer = shard(sb.optimizer, 1);

    double mult = double(in_flight(l, stage));
    if (l.schedule == PipelineSchedule::interleaved && l.vpp > 1) {
        mult = std::min<double>(mult * (1.0 + double(l.pp - 1) / (double(l.pp) * l.vpp)),
                                double(l.n_micro));
    }
    const double s = double(w.seq_len) / l.cp;
    const double sbh = s * l.micro_batch * m.n_embd;
    const double ab = act_bytes(w.dtype);
    const auto [blocks, peak] = stage_block_activations(w, l, split, stage);
    double act = blocks * mult;
    if (l.recompute == Recompute::full) act += peak;
    // Embedding dropout mask per micro-batch in flight (Korthikanti eq. 5:
    // sbhp/t) and, on the last stage, the LM head input and fp32 logits for
    // the cross entropy (4sbh/t + 4sbV/t).
    if (stage == 0 && m.arch == core::Arch::gpt2 && w.dropout) act += sbh * mult / l.tp;
    if (stage == l.pp - 1) {
        // Unfused, the bf16 logits, their fp32 copy and its fp32 gradient
        // are all live when the loss is differentiated: 10 sbV/t. A head
        // that works through blocks of rows keeps no logits (its scratch is
        // a buffer, below).
        const double logits = c.head_rows > 0 ? 0.0 : c.fused_ce ? 4.0 : 10.0;
        act += (2 * sbh * ab + logits * s * l.micro_batch * double(m.vocab_size)) / l.tp;
    }
    mem.activations = act;
    mem.allocator = c.alloc_frac * act;

    mem.runtime = c.dev.reserved_bytes;
    double buf = 0;
    if (l.dp * l.cp > 1 && l.zero < 3) buf += std::min(p.total(), 40e6) * 4;  // fp32 DP bucket
    if (l.zero >= 3 && c.impl == Impl::fsdp && l.pp > 1) {
        // FSDP under pipeline parallelism does not reshard after forward
        // (torchtitan's parallelize_llama: per-micro-batch all-gathers would
        // be exposed), so the stage's weights stay gathered in 16 bits, and
        // their gradients accumulate unsharded until the last micro-batch,
        // in the fp32 reduce dtype (FSDP2's unsharded_accumulated_grad).
        buf += p.total() * (sb.weight + 4.0);
    } else if (l.zero >= 3 && c.impl == Impl::apiary) {
        buf += apiary_zero3_buffers(w, l, stage);
    } else if (l.zero >= 3) {
        const double block = layer_params(m) / l.tp;
        buf += 2 * block * sb.weight;  // gathered + prefetched
    }
    if (l.tp > 1) buf += 2 * sbh * ab;  // TP all-gather / all-reduce staging
    if (m.moe()) buf += 2 * sbh * m.n_expert_active * w.capacity_factor * ab;  // all-to-all
    mem.buffers = buf + scratch_bytes(w, l, c, stage);
    mem.capacity = c.dev.mem_bytes / (c.dev.shared_by_ranks ? double(c.ranks_per_node()) : 1.0);
    return mem;
}

}  // namespace

double stage_params_per_device(const core::ModelSpec& m, const Layout& l, const StageSplit& split) {
    double best = 0;
    for (int s = 0; s < l.pp; ++s) best = std::max(best, stage_param_split(m, l, split, s).total());
    return best;
}

Memory memory_per_device(const Workload& w, const Layout& l, const Cluster& c) {
    const StageSplit split = stage_split(w, l, c.impl);
    Memory most = stage_memory(w, l, c, split, 0);
    for (int s = 1; s < l.pp; ++s) {
        Memory mem = stage_memory(w, l, c, split, s);
        if (mem.total() > most.total()) most = mem;
    }
    return most;
}

}  // namespace apiary::plan
