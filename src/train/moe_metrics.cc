#include "train/moe_metrics.h"

#include <algorithm>
#include <numeric>

namespace apiary::train {

using nlohmann::json;

json moe_load_record(parallel::Engine& engine, std::vector<obs::MoeLoad>* load) {
    model::Transformer& m = engine.model();
    const auto& stats = m.moe_stats();
    // Every MoE block of the model: a pipeline stage holds some of them and
    // fills those (zeros elsewhere); one all-reduce over the world sums each
    // block over the ranks that hold it. Decided from the spec, the same on
    // every rank, so that every rank joins the collective.
    std::vector<int> layers;
    for (int l = 0; l < m.spec().n_layer; ++l) {
        if (m.spec().moe_layer(l)) layers.push_back(l);
    }
    if (layers.empty()) return json();
    const size_t E = size_t(m.spec().n_expert);
    // Per block E routed, E dropped, aux, z, batches.
    const size_t per = 2 * E + 3;
    std::vector<double> buf(layers.size() * per, 0.0);
    for (const auto& st : stats) {
        const size_t i =
            size_t(std::find(layers.begin(), layers.end(), st.layer) - layers.begin());
        double* b = buf.data() + i * per;
        for (size_t e = 0; e < E; ++e) {
            b[e] = double(st.routed[e]);
            b[E + e] = double(st.dropped[e]);
        }
        b[2 * E] = st.aux_sum;
        b[2 * E + 1] = st.z_sum;
        b[2 * E + 2] = double(st.batches);
    }
    engine.world()
        .all_reduce(buf.data(), int64_t(buf.size()), core::DType::f64, comm::ReduceOp::sum,
                    {"moe_load", 0})
        ->wait();
    json out = json::array();
    load->clear();
    for (size_t i = 0; i < layers.size(); ++i) {
        const double* b = buf.data() + i * per;
        obs::MoeLoad l;
        l.layer = layers[i];
        l.tokens.assign(b, b + E);
        const double total = std::accumulate(b, b + E, 0.0);
        const double most = *std::max_element(b, b + E);
        l.imbalance = total > 0 ? most / (total / double(E)) : 0.0;
        l.dropped = std::accumulate(b + E, b + 2 * E, 0.0);
        const double batches = std::max(1.0, b[2 * E + 2]);
        std::vector<int64_t> tokens(E), dropped(E);
        for (size_t e = 0; e < E; ++e) {
            tokens[e] = int64_t(b[e]);
            dropped[e] = int64_t(b[E + e]);
        }
        out.push_back({{"layer", l.layer},
                       {"tokens", tokens},
                       {"dropped", dropped},
                       {"dropped_total", int64_t(l.dropped)},
                       {"imbalance", l.imbalance},
                       {"aux_loss", b[2 * E] / batches},
                       {"z_loss", b[2 * E + 1] / batches}});
        load->push_back(std::move(l));
    }
    m.reset_moe_stats();
    return out;
}

}  // namespace apiary::train
