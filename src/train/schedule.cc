#include "train/schedule.h"

#include <algorithm>
#include <cmath>

#include "optim/adamw.h"

namespace apiary::train {

LrSchedule::LrSchedule(int64_t steps, int64_t warmup_steps, double peak, double min_lr,
                       bool by_tokens, int64_t varying_steps,
                       const std::function<int64_t(int64_t)>& tokens_of)
    : steps_(steps), warmup_(warmup_steps), peak_(peak), min_(min_lr), by_tokens_(by_tokens) {
    const int64_t n = std::clamp<int64_t>(varying_steps, 0, steps);
    prefix_.assign(size_t(n) + 1, 0);
    for (int64_t s = 0; s < n; ++s) prefix_[size_t(s) + 1] = prefix_[size_t(s)] + tokens_of(s);
    steady_ = tokens_of(n);
}

int64_t LrSchedule::tokens_before(int64_t step) const {
    const int64_t n = int64_t(prefix_.size()) - 1;
    if (step <= n) return prefix_[size_t(std::max<int64_t>(0, step))];
    return prefix_.back() + (step - n) * steady_;
}

double LrSchedule::at(int64_t step) const {
    if (!by_tokens_) return optim::lr_schedule(step, steps_, warmup_, peak_, min_);
    // optim::lr_schedule with step s read as the tokens before it (decay)
    // and after it (warmup: step s is the (s+1)-th of the ramp).
    const double before = double(tokens_before(step)), after = double(tokens_before(step + 1));
    const double warm = double(warmup_) * double(steady_), total = double(tokens_before(steps_));
    if (warm > 0 && before < warm) return peak_ * std::min(1.0, after / warm);
    if (before >= total) return min_;
    const double progress = (before - warm) / std::max(1.0, total - warm);
    return min_ + 0.5 * (peak_ - min_) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace apiary::train
