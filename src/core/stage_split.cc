#include "core/stage_split.h"

#include <fmt/format.h>

#include <limits>
#include <numeric>
#include <sstream>

#include "core/error.h"

namespace apiary::core {

std::vector<int> balanced_stage_layers(const ModelSpec& spec, int parts, int seq_len) {
    const int L = spec.n_layer;
    // Training FLOPs per token (forward and backward): a block's matmuls
    // and attention, and the LM head on the last stage.
    const double block = 6.0 * double(spec.attn_params() + spec.mlp_params(spec.ffn_dim())) +
                         6.0 * double(seq_len) * double(spec.qk_width() + spec.v_width());
    const double head = 6.0 * double(spec.vocab_size) * double(spec.n_embd);
    // best[k][l]: the smallest possible maximum over the first k parts
    // holding the first l blocks (each part at least one block).
    const double inf = std::numeric_limits<double>::infinity();
    std::vector<std::vector<double>> best(size_t(parts) + 1,
                                          std::vector<double>(size_t(L) + 1, inf));
    std::vector<std::vector<int>> cut(size_t(parts) + 1, std::vector<int>(size_t(L) + 1, 0));
    best[0][0] = 0;
    for (int k = 1; k <= parts; ++k) {
        for (int l = k; l <= L; ++l) {
            for (int from = k - 1; from < l; ++from) {
                double cost = double(l - from) * block;
                if (k == parts) cost += head;
                const double m = std::max(best[size_t(k - 1)][size_t(from)], cost);
                if (m < best[size_t(k)][size_t(l)] - 1e-9) {
                    best[size_t(k)][size_t(l)] = m;
                    cut[size_t(k)][size_t(l)] = from;
                }
            }
        }
    }
    std::vector<int> counts(static_cast<size_t>(parts));
    int l = L;
    for (int k = parts; k >= 1; --k) {
        const int from = cut[size_t(k)][size_t(l)];
        counts[size_t(k - 1)] = l - from;
        l = from;
    }
    return counts;
}

std::vector<int> parse_stage_layers(const std::string& text, const ModelSpec& spec, int parts,
                                    bool virtual_stages) {
    std::vector<int> out;
    std::stringstream ss(text);
    std::string item;
    while (std::getline(ss, item, ',')) {
        try {
            size_t used = 0;
            const int v = std::stoi(item, &used);
            if (used != item.size() || v < 1) throw std::invalid_argument(item);
            out.push_back(v);
        } catch (const std::exception&) {
            throw ConfigError(
                fmt::format("parallel.stage_layers = '{}': '{}' is not a block "
                            "count (1, 2, ...)",
                            text, item));
        }
    }
    const int sum = std::accumulate(out.begin(), out.end(), 0);
    const int L = spec.n_layer;
    if (int(out.size()) != parts || sum != L) {
        throw ConfigError(fmt::format(
            "parallel.stage_layers = '{}': {} entries summing to {}, but the model has "
            "model.n_layer = {} blocks over {} {}stages; give {} counts that sum to {}",
            text, out.size(), sum, L, parts, virtual_stages ? "virtual " : "", parts, L));
    }
    return out;
}

}  // namespace apiary::core
