#pragma once
// The collectives tensor parallelism needs, as the model calls them. The
// model is single-device code; where a column- or row-parallel matmul's
// partial results meet it calls these (Megatron's paired mappings: identity
// forward / all-reduce backward, and the reverse; under sequence
// parallelism all-gather / reduce-scatter along the rows). parallel/
// implements it over a process group; a tensor-parallel size of 1 never
// calls it. Every call blocks until its result is in place.

#include <cstdint>
#include <vector>

namespace apiary::model {

class TensorParallelComm {
  public:
    virtual ~TensorParallelComm() = default;
    virtual int size() const = 0;
    virtual int rank() const = 0;
    virtual void all_reduce_sum(float* x, int64_t n) = 0;
    virtual void all_reduce_max(float* x, int64_t n) = 0;
    // Rank r's rows (rows x cols) are block r of full (size * rows, cols);
    // local may be that block of full itself.
    virtual void all_gather_rows(const float* local, float* full, int64_t rows, int64_t cols) = 0;
    virtual void all_gather_rows_bf16(const uint16_t* local, uint16_t* full, int64_t rows,
                                      int64_t cols) = 0;
    // full (size * rows, cols) summed over ranks; rank r receives block r.
    virtual void reduce_scatter_rows(const float* full, float* local, int64_t rows,
                                     int64_t cols) = 0;
};

// The all-to-alls of expert parallelism, as an MoE block calls them
// (model/moe.cc): token rows go to the rank that holds their expert and the
// results come back. parallel/ implements it over the ep process group; an
// ep size of 1 never calls it. Every call blocks until its result is in place.
class ExpertParallelComm {
  public:
    virtual ~ExpertParallelComm() = default;
    virtual int size() const = 0;
    virtual int rank() const = 0;
    // Block j (per_rank counts) of send goes to rank j; block i of recv
    // (size * per_rank) comes from rank i.
    virtual void all_to_all_counts(const int64_t* send, int64_t* recv, int64_t per_rank) = 0;
    // send_rows[j] rows of `cols` floats go to rank j, recv_rows[i] come from
    // rank i; blocks back to back in rank order.
    virtual void all_to_all_rows(const float* send, const std::vector<int64_t>& send_rows,
                                 float* recv, const std::vector<int64_t>& recv_rows,
                                 int64_t cols) = 0;
};

}  // namespace apiary::model
