// Mixture-of-experts blocks: the MLP of every block after
// model.moe_dense_layers becomes a router, n_expert routed expert MLPs (a
// token uses n_expert_active of them) and n_shared_expert MLPs every token
// uses, stored as one MLP of their summed width. The experts are the
// family's MLP without biases: GELU (gpt2) or SwiGLU (llama).
//
// One micro-batch on one rank: logits = x Wr^T -> routing (kernels/cpu/
// moe.cc) -> the chosen tokens' rows gathered per expert -> one gemm per
// expert and matmul -> combined back with the gates. The router losses
// (load balancing, z-loss) are per micro-batch and block, and enter the
// gradient scaled as the cross-entropy of the micro-batch's N tokens is,
// so gradient accumulation and data parallelism weight them like the loss.
// The block computes in fp32 in every mode: in a bf16 model it reads the
// fp32 master weights and an fp32 copy of its normed input (blocks.cc).
//
// Expert parallelism (shard().ep_size > 1): this rank holds experts
// [ep_rank El, (ep_rank + 1) El), El = E / ep, under their global names.
// Routing stays local (every rank holds the router); the gathered rows,
// already ordered by expert, go to the experts' ranks in one all-to-all
// (counts first), run there expert-major, and come back in a second one;
// backward sends the outputs' gradients the same way and the inputs'
// gradients back. The math is the one-rank block's: only where the expert
// GEMMs run changes.
//
// The sigmoid router's selection bias (DeepSeek-V3) is a parameter whose
// "gradient" is the load error f_e - 1/E of each micro-batch: the optimizer
// lowers the bias of an overloaded expert and raises that of an idle one
// (with AdamW about lr per step, the sign update of DeepSeek-V3 with its
// rate gamma = lr). It lives in the flat buffer, so data parallelism
// averages it, ZeRO shards it and checkpoints keep it like any parameter.

#include "model/moe.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "core/profile.h"
#include "core/trace.h"

namespace apiary::model {

namespace k = apiary::kernels;
using core::Arch;
using core::DType;
using core::MemCategory;

namespace {

k::MoeRouter router_of(const core::ModelSpec& s) {
    return s.moe_sigmoid ? k::MoeRouter::sigmoid : k::MoeRouter::softmax;
}

// Rows received from ep ranks come source-major (rank s, then local expert
// le: counts[s El + le] rows each); the grouped GEMMs want them expert-major
// (le, then s). Copies every segment from one order to the other.
void permute_rows(float* dst, const float* src, const std::vector<int64_t>& counts, int ep,
                  int64_t El, int64_t C, bool to_expert_major) {
    std::vector<int64_t> src_major(counts.size()), expert_major(counts.size());
    int64_t at = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
        src_major[i] = at;
        at += counts[i];
    }
    at = 0;
    for (int64_t le = 0; le < El; ++le) {
        for (int s = 0; s < ep; ++s) {
            const size_t i = size_t(s * El + le);
            expert_major[i] = at;
            at += counts[i];
        }
    }
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t i = 0; i < counts.size(); ++i) {
        const int64_t from = to_expert_major ? src_major[i] : expert_major[i];
        const int64_t to = to_expert_major ? expert_major[i] : src_major[i];
        std::copy_n(src + from * C, counts[i] * C, dst + to * C);
    }
}

// The most rows this rank's experts can receive in one micro-batch of N
// tokens: each of ep ranks sends at most its N K choices, and at most
// capacity rows per expert.
int64_t max_expert_rows(const core::ModelSpec& s, int64_t N, int ep) {
    const int64_t E = s.n_expert, K = s.n_expert_active;
    if (ep == 1) return N * K;
    const int64_t cap = k::moe_capacity(N, E, K, s.moe_capacity_factor, s.moe_dropless);
    return ep * std::min(N * K, (E / ep) * cap);
}

}  // namespace

void Transformer::add_moe_params(int l) {
    const int64_t C = dims_.C, E = spec_.n_expert, Fe = spec_.expert_ffn_dim(),
                  S = spec_.n_shared_expert;
    const bool gpt2 = spec_.arch == Arch::gpt2;
    const std::string p =
        gpt2 ? fmt::format("h.{}.mlp.", l) : fmt::format("model.layers.{}.mlp.", l);
    auto& reg = registry_;
    auto mat = [&](const std::string& name, int64_t rows, int64_t cols, Init init,
                   bool pad_after = true) {
        reg.add(name, {rows, cols}, true, l, pad_after).init = init;
    };
    mat(p + "gate.weight", E, C, Init::normal);
    if (spec_.moe_sigmoid) reg.add(p + "gate.e_score_correction_bias", {E}, false, l).init =
        Init::zeros;
    // One expert (or the shared ones) of width F: the family's MLP, no biases;
    // SwiGLU's gate and up back to back, one (2F, C) matrix.
    auto mlp = [&](const std::string& q, int64_t F) {
        if (gpt2) {
            mat(q + "c_fc.weight", F, C, Init::normal);
            mat(q + "c_proj.weight", C, F, Init::normal_residual);
        } else {
            mat(q + "gate_proj.weight", F, C, Init::normal, false);
            mat(q + "up_proj.weight", F, C, Init::normal);
            mat(q + "down_proj.weight", C, F, Init::normal_residual);
        }
    };
    if (S > 0) mlp(p + "shared_experts.", S * Fe);
    // The routed experts last: under expert parallelism they are a unit of
    // their own (model.cc, build_units), starting on a unit boundary.
    if (shard_.ep_size > 1) reg.align(flat_multiple_);
    const size_t first = reg.entries().size();
    const int64_t El = E / shard_.ep_size, e0 = shard_.ep_rank * El;
    for (int64_t e = e0; e < e0 + El; ++e) mlp(p + fmt::format("experts.{}.", e), Fe);
    for (size_t i = first; i < reg.entries().size(); ++i) reg.entries()[i].expert = true;
}

void Transformer::resolve_moe_handles(int l, const std::string& prefix) {
    const auto& r = registry_;
    const bool gpt2 = spec_.arch == Arch::gpt2;
    BlockParams& b = block_params_[size_t(l)];
    const std::string p = prefix + "mlp.";
    const std::string first = gpt2 ? "c_fc.weight" : "gate_proj.weight";
    const std::string second = gpt2 ? "c_proj.weight" : "down_proj.weight";
    b.moe = true;
    b.router_w = r.index_of(p + "gate.weight");
    b.router_bias = r.index_of(p + "gate.e_score_correction_bias");
    const int El = spec_.n_expert / shard_.ep_size, e0 = shard_.ep_rank * El;
    for (int e = e0; e < e0 + El; ++e) {
        const std::string q = p + fmt::format("experts.{}.", e);
        b.expert_fc_w.push_back(r.index_of(q + first));
        b.expert_fc2_w.push_back(r.index_of(q + second));
    }
    if (spec_.n_shared_expert > 0) {
        b.shared_fc_w = r.index_of(p + "shared_experts." + first);
        b.shared_fc2_w = r.index_of(p + "shared_experts." + second);
    }
}

void Transformer::allocate_moe() {
    if (!spec_.moe()) return;
    const bool gpt2 = spec_.arch == Arch::gpt2;
    const int64_t N = max_B_ * max_T_, C = dims_.C, E = spec_.n_expert, K = spec_.n_expert_active,
                  Fe = spec_.expert_ffn_dim(), fw = gpt2 ? Fe : 2 * Fe,
                  S = spec_.n_shared_expert;
    const int ep = shard_.ep_size;
    const int64_t R = max_expert_rows(spec_, N, ep);
    const auto act = MemCategory::activations;
    for (auto& c : chunks_) {
        for (auto& s : c.slots) {
            for (size_t j = 0; j < c.layers.size(); ++j) {
                if (!spec_.moe_layer(c.layers[j])) continue;
                MoeActs m;
                m.logits = core::Tensor({N, E}, DType::f32, act);
                m.probs = core::Tensor({N, E}, DType::f32, act);
                m.gate = core::Tensor({N, K}, DType::f32, act);
                // int32 arrays in f32-sized storage.
                m.expert = core::Tensor({N, K}, DType::f32, act);
                m.slot = core::Tensor({N, K}, DType::f32, act);
                m.token_of = core::Tensor({N * K}, DType::f32, act);
                m.offsets = core::Tensor({E + 1}, DType::i64, act);
                m.routed = core::Tensor({E}, DType::i64, act);
                m.dropped = core::Tensor({E}, DType::i64, act);
                m.xg = core::Tensor({N * K, C}, DType::f32, act);
                if (ep > 1) m.xr = core::Tensor({R, C}, DType::f32, act);
                m.h = core::Tensor({R, fw}, DType::f32, act);
                m.act = core::Tensor({R, Fe}, DType::f32, act);
                m.ye = core::Tensor({N * K, C}, DType::f32, act);
                if (S > 0) {
                    m.sh_h = core::Tensor({N, S * fw}, DType::f32, act);
                    m.sh_act = core::Tensor({N, S * Fe}, DType::f32, act);
                }
                s.layers[j].moe = int(moe_acts_.size());
                moe_acts_.push_back(std::move(m));
            }
        }
    }
    const auto buf = MemCategory::buffers;
    // The gradient of the expert outputs and later of the gathered inputs
    // share one buffer (the first is dead before the second is written).
    moe_dye_ = core::Tensor({N * K, C}, DType::f32, buf);
    moe_dh_ = core::Tensor({R, fw}, DType::f32, buf);
    moe_dact_ = core::Tensor({R, Fe}, DType::f32, buf);
    if (ep > 1) {
        // The rows in flight (source-major), and the expert side's outputs
        // in forward / their gradients, then the inputs', in backward.
        moe_ep_buf_ = core::Tensor({R, C}, DType::f32, buf);
        moe_dyr_ = core::Tensor({R, C}, DType::f32, buf);
    }
    moe_dgate_ = core::Tensor({N, K}, DType::f32, buf);
    moe_dlogits_ = core::Tensor({N, E}, DType::f32, buf);
    if (S > 0) {
        moe_dsh_h_ = core::Tensor({N, S * fw}, DType::f32, buf);
        moe_dsh_act_ = core::Tensor({N, S * Fe}, DType::f32, buf);
    }
    moe_stat_of_layer_.assign(size_t(spec_.n_layer), -1);
    for (int l : local_layers_) {
        if (!spec_.moe_layer(l)) continue;
        moe_stat_of_layer_[size_t(l)] = int(moe_stats_.size());
        MoeLayerStats st;
        st.layer = l;
        moe_stats_.push_back(st);
    }
    reset_moe_stats();
}

void Transformer::reset_moe_stats() {
    for (auto& st : moe_stats_) {
        st.routed.assign(size_t(spec_.n_expert), 0);
        st.dropped.assign(size_t(spec_.n_expert), 0);
        st.aux_sum = st.z_sum = 0.0;
        st.batches = 0;
    }
}

void Transformer::moe_forward(int l, const LayerActs& a, const float* x, float* out, int64_t N) {
    APIARY_PROFILE("moe forward");
    const BlockParams& p = block_params_[size_t(l)];
    MoeActs& m = moe_acts_[size_t(a.moe)];
    const bool gpt2 = spec_.arch == Arch::gpt2;
    const int64_t C = dims_.C, E = spec_.n_expert, K = spec_.n_expert_active,
                  Fe = spec_.expert_ffn_dim(), fw = gpt2 ? Fe : 2 * Fe,
                  S = spec_.n_shared_expert;
    m.N = N;
    k::linear_forward(m.logits.f32(), x, P(p.router_w), nullptr, N, C, E);
    const int64_t capacity =
        k::moe_capacity(N, E, K, spec_.moe_capacity_factor, spec_.moe_dropless);
    m.losses =
        k::moe_route_forward(m.route_out(), m.logits.f32(),
                             p.router_bias >= 0 ? P(p.router_bias) : nullptr, N, E, K,
                             router_of(spec_), capacity);
    const int64_t* offsets = m.offsets.data<int64_t>();
    const int64_t M = offsets[E];
    k::moe_gather(m.xg.f32(), x, m.token_of.data<int32_t>(), M, C);
    // This rank's experts: all of them (their rows are xg), or under expert
    // parallelism El of them over the rows every ep rank sent (xr).
    const bool ep = shard_.ep_size > 1;
    const int64_t El = E / shard_.ep_size;
    const int64_t R = ep ? moe_dispatch(m) : M;
    const float* xe = ep ? m.xr.f32() : m.xg.f32();
    const int64_t* eoff = ep ? m.local_offsets.data() : offsets;
    std::vector<const float*> W1(static_cast<size_t>(El)), W2(static_cast<size_t>(El));
    for (int64_t e = 0; e < El; ++e) {
        W1[size_t(e)] = P(p.expert_fc_w[size_t(e)]);
        W2[size_t(e)] = P(p.expert_fc2_w[size_t(e)]);
    }
    k::grouped_linear_forward(m.h.f32(), xe, W1.data(), eoff, El, C, fw);
    if (gpt2) {
        k::gelu_forward(m.act.f32(), m.h.f32(), R * Fe);
    } else {
        k::swiglu_forward(m.act.f32(), m.h.f32(), R, Fe);
    }
    float* ye = ep ? moe_dyr_.f32() : m.ye.f32();
    k::grouped_linear_forward(ye, m.act.f32(), W2.data(), eoff, El, Fe, C);
    if (ep) moe_return(m, ye, m.ye.f32());
    if (S > 0) {
        k::linear_forward(m.sh_h.f32(), x, P(p.shared_fc_w), nullptr, N, C, S * fw);
        if (gpt2) {
            k::gelu_forward(m.sh_act.f32(), m.sh_h.f32(), N * S * Fe);
        } else {
            k::swiglu_forward(m.sh_act.f32(), m.sh_h.f32(), N, S * Fe);
        }
        k::linear_forward(out, m.sh_act.f32(), P(p.shared_fc2_w), nullptr, N, S * Fe, C);
    } else {
        std::fill_n(out, N * C, 0.0f);
    }
    k::moe_combine_forward(out, m.ye.f32(), m.slot.data<int32_t>(), m.gate.f32(), N, K, C);
}

void Transformer::moe_backward(int l, const LayerActs& a, const float* x, const float* dy,
                               int64_t N) {
    APIARY_PROFILE("moe backward");
    const BlockParams& p = block_params_[size_t(l)];
    MoeActs& m = moe_acts_[size_t(a.moe)];
    APIARY_CHECK(m.N == N, "moe backward of {} rows after a forward of {}", N, m.N);
    const bool gpt2 = spec_.arch == Arch::gpt2;
    const int64_t C = dims_.C, E = spec_.n_expert, K = spec_.n_expert_active,
                  Fe = spec_.expert_ffn_dim(), fw = gpt2 ? Fe : 2 * Fe,
                  S = spec_.n_shared_expert;
    const int64_t* offsets = m.offsets.data<int64_t>();
    const int32_t* slot = m.slot.data<int32_t>();
    const bool ep = shard_.ep_size > 1;
    const int64_t El = E / shard_.ep_size;
    const int64_t R = ep ? m.local_offsets[size_t(El)] : offsets[E];
    const float* xe = ep ? m.xr.f32() : m.xg.f32();
    const int64_t* eoff = ep ? m.local_offsets.data() : offsets;
    float* dx = dnorm_.f32();  // (N, C) the gradient of the block's normed input
    if (S > 0) {
        k::linear_backward(moe_dsh_act_.f32(), G(p.shared_fc2_w), nullptr, dy, m.sh_act.f32(),
                           P(p.shared_fc2_w), N, S * Fe, C);
        if (gpt2) {
            k::gelu_backward(moe_dsh_h_.f32(), m.sh_h.f32(), moe_dsh_act_.f32(), N * S * Fe);
        } else {
            k::swiglu_backward(moe_dsh_h_.f32(), moe_dsh_act_.f32(), m.sh_h.f32(), N, S * Fe);
        }
        k::linear_backward(dx, G(p.shared_fc_w), nullptr, moe_dsh_h_.f32(), x, P(p.shared_fc_w),
                           N, C, S * fw);
    } else {
        std::fill_n(dx, N * C, 0.0f);
    }
    std::vector<const float*> W1(static_cast<size_t>(El)), W2(static_cast<size_t>(El));
    std::vector<float*> dW1(static_cast<size_t>(El)), dW2(static_cast<size_t>(El));
    for (int64_t e = 0; e < El; ++e) {
        W1[size_t(e)] = P(p.expert_fc_w[size_t(e)]);
        W2[size_t(e)] = P(p.expert_fc2_w[size_t(e)]);
        dW1[size_t(e)] = G(p.expert_fc_w[size_t(e)]);
        dW2[size_t(e)] = G(p.expert_fc2_w[size_t(e)]);
    }
    float* dye = moe_dye_.f32();
    k::moe_combine_backward(dye, moe_dgate_.f32(), dy, m.ye.f32(), slot, m.gate.f32(), N, K, C);
    // The expert side: the outputs' gradients where the experts are.
    float* dyr = dye;
    if (ep) {
        dyr = moe_dyr_.f32();
        moe_send(m, dye, dyr);
    }
    k::grouped_linear_backward(moe_dact_.f32(), dW2.data(), dyr, m.act.f32(), W2.data(), eoff, El,
                               Fe, C);
    if (gpt2) {
        k::gelu_backward(moe_dh_.f32(), m.h.f32(), moe_dact_.f32(), R * Fe);
    } else {
        k::swiglu_backward(moe_dh_.f32(), moe_dact_.f32(), m.h.f32(), R, Fe);
    }
    float* dxr = dyr;  // dyr is dead from here
    k::grouped_linear_backward(dxr, dW1.data(), moe_dh_.f32(), xe, W1.data(), eoff, El, C, fw);
    float* dxg = moe_dye_.f32();
    if (ep) moe_return(m, dxr, dxg);
    k::moe_gather_backward(dx, dxg, slot, N, K, C);

    // The router: the gates' gradient plus the two losses, scaled as the
    // cross-entropy of these N tokens is.
    const float scale = float(N) * moe_grad_scale_;
    const int64_t* routed = m.routed.data<int64_t>();
    k::moe_route_backward(moe_dlogits_.f32(), moe_dgate_.f32(), m.logits.f32(), m.probs.f32(),
                          m.expert.data<int32_t>(), routed, N, E, K, router_of(spec_),
                          spec_.moe_aux_loss_coef * scale, spec_.moe_z_loss_coef * scale);
    k::gemm(false, false, N, C, E, moe_dlogits_.f32(), E, P(p.router_w), C, 1.0f, dx, C);
    k::gemm(true, false, E, C, N, moe_dlogits_.f32(), E, x, C, 1.0f, G(p.router_w), C);
    if (p.router_bias >= 0) {
        // The load error f_e - 1/E as the bias's gradient (see the top).
        float* db = G(p.router_bias);
        for (int64_t e = 0; e < E; ++e) {
            db[e] += scale * float(double(routed[e]) / double(N * K) - 1.0 / double(E));
        }
    }
    MoeLayerStats& st = moe_stats_[size_t(moe_stat_of_layer_[size_t(l)])];
    const int64_t* dropped = m.dropped.data<int64_t>();
    for (int64_t e = 0; e < E; ++e) {
        st.routed[size_t(e)] += routed[e];
        st.dropped[size_t(e)] += dropped[e];
    }
    st.aux_sum += m.losses.aux;
    st.z_sum += m.losses.z;
    st.batches += 1;
}

int64_t Transformer::moe_dispatch(MoeActs& m) {
    APIARY_CHECK(ep_ != nullptr && ep_->size() == shard_.ep_size,
                 "expert parallelism over {} ranks without its communicator", shard_.ep_size);
    const int ep = shard_.ep_size;
    const int64_t E = spec_.n_expert, El = E / ep;
    const int64_t* offsets = m.offsets.data<int64_t>();
    // Rows per expert, exchanged first: rank j gets the counts of its El.
    std::vector<int64_t> counts(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) counts[size_t(e)] = offsets[e + 1] - offsets[e];
    m.recv_counts.assign(size_t(ep * El), 0);
    ep_->all_to_all_counts(counts.data(), m.recv_counts.data(), El);
    m.send_rows.assign(size_t(ep), 0);
    m.recv_rows.assign(size_t(ep), 0);
    for (int j = 0; j < ep; ++j) {
        m.send_rows[size_t(j)] = offsets[(j + 1) * El] - offsets[j * El];
        for (int64_t le = 0; le < El; ++le) {
            m.recv_rows[size_t(j)] += m.recv_counts[size_t(j * El + le)];
        }
    }
    m.local_offsets.assign(size_t(El + 1), 0);
    for (int64_t le = 0; le < El; ++le) {
        int64_t rows = 0;
        for (int s = 0; s < ep; ++s) rows += m.recv_counts[size_t(s * El + le)];
        m.local_offsets[size_t(le + 1)] = m.local_offsets[size_t(le)] + rows;
    }
    const int64_t R = m.local_offsets[size_t(El)];
    APIARY_CHECK(R <= m.xr.shape()[0], "{} rows for this rank's experts exceed the bound {}", R,
                 m.xr.shape()[0]);
    moe_send(m, m.xg.f32(), m.xr.f32());
    return R;
}

void Transformer::moe_send(MoeActs& m, const float* in, float* rows) {
    const int ep = shard_.ep_size;
    const int64_t C = dims_.C, El = spec_.n_expert / ep;
    ep_->all_to_all_rows(in, m.send_rows, moe_ep_buf_.f32(), m.recv_rows, C);
    permute_rows(rows, moe_ep_buf_.f32(), m.recv_counts, ep, El, C, true);
}

void Transformer::moe_return(MoeActs& m, const float* rows, float* out) {
    const int ep = shard_.ep_size;
    const int64_t C = dims_.C, El = spec_.n_expert / ep;
    permute_rows(moe_ep_buf_.f32(), rows, m.recv_counts, ep, El, C, false);
    ep_->all_to_all_rows(moe_ep_buf_.f32(), m.recv_rows, out, m.send_rows, C);
}

}  // namespace apiary::model
