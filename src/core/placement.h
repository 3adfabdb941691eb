#pragma once
// Where a rank's part of a tensor sits in the whole (global) tensor: the
// concatenation, along one dimension, of pieces of it. Under tensor
// parallelism GPT-2's fused q|k|v weight is three row ranges (whole heads);
// a row-parallel weight is a column range. The model's registry, the
// checkpoints (which store tensors by global name, so any layout loads any
// other) and initialisation (a pure function of the global index) all use
// it.

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace apiary::core {

struct Placement {
    std::vector<int64_t> global_shape;
    std::vector<int64_t> local_shape;
    int dim = -1;                                     // -1: not split (local is global)
    std::vector<std::pair<int64_t, int64_t>> pieces;  // (global start, length) along dim

    int64_t local_numel() const;
    int64_t global_numel() const;
    // Calls fn(global_flat_start, local_flat_start, length) for every
    // maximal run of local elements that is contiguous in the global tensor,
    // in increasing local (and global) order, restricted to the local
    // elements [begin, begin + count) (count < 0: to the end).
    void for_each_run(const std::function<void(int64_t, int64_t, int64_t)>& fn, int64_t begin = 0,
                      int64_t count = -1) const;
    // Throws std::invalid_argument describing the first inconsistency
    // (pieces outside the global dimension, shapes that disagree).
    void validate() const;
};

}  // namespace apiary::core
