#include "model/layout.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"

namespace apiary::model {

void vocab_slice(int64_t V, int tp_size, int tp_rank, int64_t* begin, int64_t* count) {
    const int64_t per = (V + tp_size - 1) / tp_size;
    const int64_t b = std::min<int64_t>(V, per * tp_rank);
    *begin = b;
    *count = std::min<int64_t>(V, b + per) - b;
}

LocalDims local_dims(const core::ModelSpec& spec, int tp, int rank) {
    auto divisors = [](int64_t n, int64_t limit) {
        std::string s;
        for (int64_t d = 1; d <= std::min<int64_t>(n, limit); ++d) {
            if (n % d == 0) s += (s.empty() ? "" : ", ") + std::to_string(d);
        }
        return s;
    };
    APIARY_CHECK(tp >= 1 && rank >= 0 && rank < tp, "tensor-parallel rank {} of {}", rank, tp);
    const int64_t F = spec.ffn_dim();
    if (spec.n_head % tp != 0) {
        throw ConfigError(
            fmt::format("parallel.tp = {} does not divide model.n_head = {}: each "
                        "rank holds whole heads (tp can be {})",
                        tp, spec.n_head, divisors(spec.n_head, 64)));
    }
    if (spec.n_kv_head % tp != 0) {
        throw ConfigError(
            fmt::format("parallel.tp = {} does not divide model.n_kv_head = {}: each "
                        "rank holds whole key/value groups (tp can be {})",
                        tp, spec.n_kv_head, divisors(spec.n_kv_head, 64)));
    }
    if (F % tp != 0) {
        throw ConfigError(
            fmt::format("parallel.tp = {} does not divide the MLP width {} "
                        "(model.ffn_hidden; tp can be {})",
                        tp, F, divisors(F, 64)));
    }
    LocalDims d;
    d.C = spec.n_embd;
    d.HS = spec.head_size();
    d.NH = spec.n_head / tp;
    d.KVH = spec.n_kv_head / tp;
    d.F = F / tp;
    vocab_slice(spec.vocab_size, tp, rank, &d.v0, &d.Vl);
    int64_t last_begin = 0, last_count = 0;
    vocab_slice(spec.vocab_size, tp, tp - 1, &last_begin, &last_count);
    if (last_count <= 0) {
        throw ConfigError(
            fmt::format("parallel.tp = {} is more than a vocabulary of {} tokens "
                        "split in slices of {} can serve: the last rank gets none",
                        tp, spec.vocab_size, (spec.vocab_size + tp - 1) / tp));
    }
    return d;
}

}  // namespace apiary::model
