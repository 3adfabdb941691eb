#pragma once
// The learning rate of each step: linear warmup to train.lr, then cosine
// decay to train.min_lr at train.steps (optim::lr_schedule).
//
// Its clock is train.lr_schedule_by:
//   steps   step s of train.steps (warmup: the first train.warmup_steps steps).
//   tokens  tokens consumed over all ranks. Warmup lasts as many tokens as
//           train.warmup_steps steps of the full batch shape; the decay
//           reaches train.min_lr with the tokens of the last step.
// They differ only when the tokens per step vary, i.e. under a
// sequence-length curriculum in `batch` mode (short early steps): by tokens,
// those steps advance the schedule by what they train on. When every step
// has the same shape, both clocks give the same rate at every step.

#include <cstdint>
#include <functional>
#include <vector>

namespace apiary::train {

class LrSchedule {
  public:
    // tokens_of(s): tokens that step s consumes over all ranks; it may vary
    // for s < varying_steps (the curriculum) and is constant from there on.
    LrSchedule(int64_t steps, int64_t warmup_steps, double peak, double min_lr, bool by_tokens,
               int64_t varying_steps, const std::function<int64_t(int64_t)>& tokens_of);

    double at(int64_t step) const;
    // Tokens consumed by steps [0, step).
    int64_t tokens_before(int64_t step) const;

  private:
    int64_t steps_, warmup_;
    double peak_, min_;
    bool by_tokens_;
    std::vector<int64_t> prefix_;  // tokens before step s, s <= varying steps
    int64_t steady_ = 0;           // tokens of every later step
};

}  // namespace apiary::train
