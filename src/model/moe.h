#pragma once
// Internal to model/: what a mixture-of-experts block saves between its
// forward and backward (model/moe.cc).

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/kernels.h"
#include "model/model.h"

namespace apiary::model {

// One MoE block's routing and expert activations for one micro-batch slot.
// Sizes for N = max_B max_T tokens, E experts, K per token, Fe the expert
// width, fw the width of an expert's first matmul (Fe, or 2 Fe for SwiGLU),
// S shared experts.
struct Transformer::MoeActs {
    core::Tensor logits, probs;  // (N, E)
    core::Tensor gate;           // (N, K) f32
    core::Tensor expert, slot;   // (N, K) int32
    core::Tensor token_of;       // (N K) int32
    core::Tensor offsets;        // (E + 1) int64
    core::Tensor routed, dropped;  // (E) int64
    core::Tensor xg;               // (N K, C) the routed copies of the block's normed input
    // Expert parallelism (ep > 1): the rows this rank's El = E / ep experts
    // received, expert-major (local expert, then source rank). R_max bounds
    // them: ep x min(N K, El x capacity). With ep = 1 the experts read xg.
    core::Tensor xr;                       // (R_max, C)
    std::vector<int64_t> send_rows, recv_rows;  // (ep) rows to / from each ep rank
    std::vector<int64_t> recv_counts;      // (ep El) rows from rank s for local expert le
    std::vector<int64_t> local_offsets;    // (El + 1) each local expert's rows in xr
    core::Tensor h, act;           // (R_max, fw), (R_max, Fe); R_max = N K with ep = 1
    core::Tensor ye;               // (N K, C) expert outputs before the gates
    core::Tensor sh_h, sh_act;     // (N, S fw), (N, S Fe) shared experts
    kernels::MoeLosses losses;
    int64_t N = 0;

    kernels::MoeRouteOut route_out() {
        kernels::MoeRouteOut o;
        o.probs = probs.f32();
        o.expert = expert.data<int32_t>();
        o.gate = gate.f32();
        o.slot = slot.data<int32_t>();
        o.offsets = offsets.data<int64_t>();
        o.token_of = token_of.data<int32_t>();
        o.routed = routed.data<int64_t>();
        o.dropped = dropped.data<int64_t>();
        return o;
    }
};

}  // namespace apiary::model
