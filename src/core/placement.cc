#include "core/placement.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <stdexcept>

namespace apiary::core {

namespace {
int64_t product(const std::vector<int64_t>& s) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    return n;
}
}  // namespace

int64_t Placement::local_numel() const { return product(local_shape); }

int64_t Placement::global_numel() const { return product(global_shape); }

void Placement::for_each_run(const std::function<void(int64_t, int64_t, int64_t)>& fn,
                             int64_t begin, int64_t count) const {
    const int64_t end = count < 0 ? local_numel() : begin + count;
    auto emit = [&](int64_t global, int64_t local, int64_t len) {
        const int64_t lo = std::max(local, begin), hi = std::min(local + len, end);
        if (lo < hi) fn(global + (lo - local), lo, hi - lo);
    };
    if (dim < 0) {
        emit(0, 0, local_numel());
        return;
    }
    // Elements per index of `dim` (inner) and the slices before it (outer).
    int64_t inner = 1, outer = 1;
    for (size_t d = size_t(dim) + 1; d < global_shape.size(); ++d) inner *= global_shape[d];
    for (int d = 0; d < dim; ++d) outer *= global_shape[size_t(d)];
    const int64_t global_dim = global_shape[size_t(dim)];
    const int64_t local_dim = local_shape[size_t(dim)];
    for (int64_t o = 0; o < outer; ++o) {
        const int64_t row_start = o * local_dim * inner;
        if (row_start >= end) break;
        if (row_start + local_dim * inner <= begin) continue;
        int64_t at = 0;  // position along dim in the local tensor
        for (const auto& [start, len] : pieces) {
            emit((o * global_dim + start) * inner, (o * local_dim + at) * inner, len * inner);
            at += len;
        }
    }
}

void Placement::validate() const {
    if (global_shape.size() != local_shape.size()) {
        throw std::invalid_argument(fmt::format("local shape has {} dims, global {}",
                                                local_shape.size(), global_shape.size()));
    }
    // Element counts are multiplied by every reader (inspect, verify, the
    // loads): a shape whose product overflows 64 bits, or exceeds what any
    // machine holds (2^48 elements), is refused here, once.
    constexpr int64_t kMaxElements = int64_t(1) << 48;
    int64_t elements = 1;
    for (size_t d = 0; d < global_shape.size(); ++d) {
        if (global_shape[d] < 0 || local_shape[d] < 0) {
            throw std::invalid_argument("negative dimension");
        }
        if (global_shape[d] > 0 && elements > kMaxElements / global_shape[d]) {
            throw std::invalid_argument(
                fmt::format("global shape [{}] has more than 2^48 elements",
                            fmt::join(global_shape, ", ")));
        }
        elements *= global_shape[d];
        if (int(d) != dim && local_shape[d] != global_shape[d]) {
            throw std::invalid_argument(
                fmt::format("dimension {} is {} locally but {} globally and is not the split one",
                            d, local_shape[d], global_shape[d]));
        }
    }
    if (dim < 0) {
        if (!pieces.empty()) throw std::invalid_argument("pieces without a split dimension");
        return;
    }
    if (size_t(dim) >= global_shape.size()) {
        throw std::invalid_argument(
            fmt::format("split dimension {} of a {}-d tensor", dim, global_shape.size()));
    }
    int64_t along = 0;
    for (const auto& [start, len] : pieces) {
        if (start < 0 || len <= 0 || start + len > global_shape[size_t(dim)]) {
            throw std::invalid_argument(fmt::format("piece [{}, {}) outside dimension {} of {}",
                                                    start, start + len, dim,
                                                    global_shape[size_t(dim)]));
        }
        along += len;
    }
    if (along != local_shape[size_t(dim)]) {
        throw std::invalid_argument(
            fmt::format("pieces cover {} of dimension {}, the local "
                        "shape {}",
                        along, dim, local_shape[size_t(dim)]));
    }
}

}  // namespace apiary::core
