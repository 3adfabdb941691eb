#include "train/moe_metrics.h"

#include <algorithm>
#include <numeric>

namespace apiary::train {

using nlohmann::json;

json moe_load_record(parallel::Engine& engine, std::vector<obs::MoeLoad>* load) {
    model::Transformer& m = engine.model();
    const auto& stats = m.moe_stats();
    if (stats.empty()) return json();
    const size_t E = stats.front().routed.size();
    // One all-reduce of every block's counts and loss sums: per block E
    // routed, E dropped, aux, z, batches.
    const size_t per = 2 * E + 3;
    std::vector<double> buf(stats.size() * per);
    for (size_t i = 0; i < stats.size(); ++i) {
        double* b = buf.data() + i * per;
        for (size_t e = 0; e < E; ++e) {
            b[e] = double(stats[i].routed[e]);
            b[E + e] = double(stats[i].dropped[e]);
        }
        b[2 * E] = stats[i].aux_sum;
        b[2 * E + 1] = stats[i].z_sum;
        b[2 * E + 2] = double(stats[i].batches);
    }
    engine.world()
        .all_reduce(buf.data(), int64_t(buf.size()), core::DType::f64, comm::ReduceOp::sum,
                    {"moe_load", 0})
        ->wait();
    json out = json::array();
    load->clear();
    for (size_t i = 0; i < stats.size(); ++i) {
        const double* b = buf.data() + i * per;
        obs::MoeLoad l;
        l.layer = stats[i].layer;
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
