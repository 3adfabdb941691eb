#pragma once
// What part of the model one rank holds. The model code is single-device
// code over local sizes; a rank of a tensor-parallel group holds whole
// attention heads, a slice of the MLP width and a slice of the vocabulary,
// and a pipeline stage holds a range of blocks with or without the
// embedding and the head. parallel/ chooses the shard; the model only
// computes on it, calling TensorParallelComm (model/tp_comm.h) where the
// ranks' partial results meet.

#include <cstdint>
#include <string>
#include <vector>

#include "core/model_spec.h"
#include "core/parallelism.h"

namespace apiary::model {

struct ModelShard {
    int tp_size = 1, tp_rank = 0;
    // The blocks this rank holds, in the order data flows through them,
    // grouped into chunks (one per virtual pipeline stage; one chunk without
    // interleaving). Empty: all blocks, one chunk.
    std::vector<std::vector<int>> chunks;
    bool embedding = true;  // holds the token (and position) embedding: first stage
    bool head = true;       // holds the final norm and the LM head: last stage
    // Megatron's sequence parallelism: norms and residuals work on this
    // rank's 1/tp of the B*T rows; all-gather before the column-parallel
    // matmuls, reduce-scatter after the row-parallel ones.
    bool sequence_parallel = false;
    core::Recompute recompute = core::Recompute::none;  // core/parallelism.h
    int slots = 1;  // micro-batches in flight per chunk (pipeline schedules)
    // Expert parallelism: this rank holds routed experts [ep_rank * E / ep,
    // (ep_rank + 1) * E / ep) of every MoE block and exchanges tokens with
    // the other ep_size - 1 ranks of its group (ExpertParallelComm).
    int ep_size = 1, ep_rank = 0;

    bool whole() const { return tp_size == 1 && embedding && head && chunks.size() <= 1; }
};

// The local sizes of a shard (shape letters of kernels/kernels.h).
struct LocalDims {
    int64_t C = 0;                                     // model width (not split)
    int64_t HS = 0;                                    // head size
    int64_t NH = 0;                                    // this rank's query heads
    int64_t KVH = 0;                                   // this rank's key/value heads
    int64_t F = 0;                                     // this rank's MLP width
    int64_t Vl = 0, v0 = 0;                            // this rank's vocabulary rows [v0, v0 + Vl)
    int64_t R() const { return (NH + 2 * KVH) * HS; }  // fused q|k|v width
    int64_t Cl() const { return NH * HS; }             // attention output width
};

// Checks that the shard fits the model (heads, KV groups, MLP width and
// vocabulary divide as tensor parallelism needs) and returns its sizes.
// Throws ConfigError naming the numbers and what would work.
LocalDims local_dims(const core::ModelSpec& spec, int tp_size, int tp_rank);

// Rows [begin, begin + count) of a vocabulary of V split over tp ranks:
// ceil(V / tp) per rank, the last ones fewer.
void vocab_slice(int64_t V, int tp_size, int tp_rank, int64_t* begin, int64_t* count);

}  // namespace apiary::model
