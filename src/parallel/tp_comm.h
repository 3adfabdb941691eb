#pragma once
// The model's tensor-parallel collectives (model/tp_comm.h) over a process
// group: the tp axis of the device mesh. Each call blocks until done; the
// time spent is counted as exposed communication.

#include <cstdint>
#include <vector>

#include "comm/process_group.h"
#include "model/tp_comm.h"

namespace apiary::parallel {

class TpComm : public model::TensorParallelComm {
  public:
    explicit TpComm(comm::ProcessGroup& group) : group_(group) {}
    int size() const override { return group_.size(); }
    int rank() const override { return group_.rank(); }
    void all_reduce_sum(float* x, int64_t n) override;
    void all_reduce_max(float* x, int64_t n) override;
    void all_gather_rows(const float* local, float* full, int64_t rows, int64_t cols) override;
    void all_gather_rows_bf16(const uint16_t* local, uint16_t* full, int64_t rows,
                              int64_t cols) override;
    void reduce_scatter_rows(const float* full, float* local, int64_t rows, int64_t cols) override;
    // Seconds spent in these calls since the last reset, and their bytes.
    double seconds() const { return seconds_; }
    double bytes() const { return bytes_; }
    void reset_counters() { seconds_ = bytes_ = 0; }

  private:
    void wait(const comm::WorkHandle& w, double bytes);
    comm::ProcessGroup& group_;
    double seconds_ = 0, bytes_ = 0;
    int64_t calls_ = 0;
};

// The MoE blocks' token all-to-alls (model/tp_comm.h) over the ep group:
// dp ranks dp_rank / ep * ep ... + ep - 1. Each call blocks until done and
// is one trace span ("ep all-to-all"); its time is the step's ep_comm.
class EpComm : public model::ExpertParallelComm {
  public:
    explicit EpComm(comm::ProcessGroup& group) : group_(group) {}
    int size() const override { return group_.size(); }
    int rank() const override { return group_.rank(); }
    void all_to_all_counts(const int64_t* send, int64_t* recv, int64_t per_rank) override;
    void all_to_all_rows(const float* send, const std::vector<int64_t>& send_rows, float* recv,
                         const std::vector<int64_t>& recv_rows, int64_t cols) override;
    double seconds() const { return seconds_; }
    double bytes() const { return bytes_; }
    void reset_counters() { seconds_ = bytes_ = 0; }

  private:
    comm::ProcessGroup& group_;
    double seconds_ = 0, bytes_ = 0;
    int64_t calls_ = 0;
};

}  // namespace apiary::parallel
