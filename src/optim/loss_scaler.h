#pragma once
// Dynamic loss scaling for fp16 training (Micikevicius et al. 2018, "Mixed
// Precision Training"): the loss is multiplied by a scale S before backward
// so small gradients survive fp16; a step whose gradients overflowed is
// skipped and S backs off; after growth_interval clean steps S grows. The
// overflow decision is one flag per step, agreed across ranks by the caller.
// Unlike frameworks that let S collapse silently (and the model quietly stop
// learning), a scale below min_scale stops the run with an error.

#include <cstdint>
#include <nlohmann/json.hpp>

namespace apiary::optim {

struct LossScalerOptions {
    double init_scale = 65536.0;
    double growth_factor = 2.0;
    double backoff_factor = 0.5;
    int64_t growth_interval = 1000;
    double min_scale = 1.0;
};

class LossScaler {
public:
    explicit LossScaler(LossScalerOptions options, bool enabled = true);

    bool enabled() const { return enabled_; }
    double scale() const { return enabled_ ? scale_ : 1.0; }
    // Records one step's outcome. Returns true if the optimizer should apply
    // the step, false if it must be skipped. Throws apiary::Error when the
    // scale falls below min_scale.
    bool update(bool overflow, int64_t step);

    int64_t skipped_steps() const { return skipped_; }
    int64_t overflows() const { return overflows_; }
    int64_t growths() const { return growths_; }
    int64_t clean_streak() const { return clean_; }

    nlohmann::json state() const;
    void restore(const nlohmann::json& state);  // throws IoError if malformed

private:
    LossScalerOptions opt_;
    bool enabled_;
    double scale_;
    int64_t clean_ = 0, skipped_ = 0, overflows_ = 0, growths_ = 0, consecutive_ = 0;
};

}  // namespace apiary::optim
