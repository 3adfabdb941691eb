#include "optim/adamw.h"

#include <algorithm>
#include <cmath>

#include "core/profile.h"
#include "kernels/kernels.h"

namespace apiary::optim {

namespace k = apiary::kernels;

AdamW::AdamW(std::vector<ParamRange> ranges, int64_t flat_size, AdamWOptions options,
             int64_t shard_begin, int64_t shard_end)
    : ranges_(std::move(ranges)),
      flat_size_(flat_size),
      opt_(options),
      begin_(shard_begin),
      end_(shard_end < 0 ? flat_size : shard_end),
      m_({end_ - begin_}, core::DType::f32, core::MemCategory::optimizer),
      v_({end_ - begin_}, core::DType::f32, core::MemCategory::optimizer) {}

double AdamW::grad_norm(const float* grads) const {
    APIARY_PROFILE("grad norm");
    double ss = 0.0;
    for (const auto& r : ranges_) {
        if (r.in_norm) ss += k::sum_squares(grads + r.grad_at(), r.numel);
    }
    return std::sqrt(ss);
}

bool AdamW::updates_all_params() const {
    if (begin_ != 0 || end_ != flat_size_) return false;
    // The ranges, sorted, must tile [0, end of the last) with no gap; the
    // padding after the last parameter is never read as a weight.
    std::vector<ParamRange> sorted = ranges_;
    std::sort(sorted.begin(), sorted.end(),
              [](const ParamRange& a, const ParamRange& b) { return a.offset < b.offset; });
    int64_t covered = 0;
    for (const auto& r : sorted) {
        if (r.offset > covered) return false;
        covered = std::max(covered, r.offset + r.numel);
    }
    return true;
}

double AdamW::step(float* params, const float* grads, float lr, float grad_scale, double raw_norm,
                   uint16_t* params_bf16) {
    APIARY_PROFILE("adamw");
    const double norm = (raw_norm >= 0 ? raw_norm : grad_norm(grads)) * grad_scale;
    float scale = grad_scale;
    // torch.nn.utils.clip_grad_norm_'s rule, so runs compare with PyTorch.
    if (opt_.grad_clip > 0 && norm > opt_.grad_clip) {
        scale = float(grad_scale * (opt_.grad_clip / (norm + 1e-6)));
    }
    ++t_;
    for (const auto& r : ranges_) {
        if (r.frozen) continue;
        // The part of this parameter inside the shard this optimizer owns.
        const int64_t lo = std::max(r.offset, begin_);
        const int64_t hi = std::min(r.offset + r.numel, end_);
        if (lo >= hi) continue;
        const float wd = r.decay ? opt_.weight_decay : 0.0f;
        float* m = m_.f32() + (lo - begin_);
        float* v = v_.f32() + (lo - begin_);
        float* p = params + r.param_at() + (lo - r.offset);
        const float* g = grads + r.grad_at() + (lo - r.offset);
        if (params_bf16) {
            k::adamw_update_bf16_copy(p, params_bf16 + r.param_at() + (lo - r.offset), g, m, v,
                                      hi - lo, lr, opt_.beta1, opt_.beta2, opt_.eps, wd, t_, scale);
        } else {
            k::adamw_update(p, g, m, v, hi - lo, lr, opt_.beta1, opt_.beta2, opt_.eps, wd, t_,
                            scale);
        }
    }
    return norm;
}

double lr_schedule(int64_t step, int64_t total, int64_t warmup, double peak, double min_lr) {
    if (warmup > 0 && step < warmup) return peak * double(step + 1) / double(warmup);
    if (step >= total) return min_lr;
    const double span = double(std::max<int64_t>(1, total - warmup));
    const double progress = double(step - warmup) / span;
    return min_lr + 0.5 * (peak - min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace apiary::optim
