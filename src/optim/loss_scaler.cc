#include "optim/loss_scaler.h"

#include <fmt/format.h>

#include "core/error.h"

namespace apiary::optim {

LossScaler::LossScaler(LossScalerOptions options, bool enabled)
    : opt_(options), enabled_(enabled), scale_(options.init_scale) {
    APIARY_CHECK(opt_.backoff_factor > 0 && opt_.backoff_factor < 1,
                 "loss scale backoff {} must be in (0, 1)", opt_.backoff_factor);
    APIARY_CHECK(opt_.growth_factor > 1, "loss scale growth {} must exceed 1", opt_.growth_factor);
}

bool LossScaler::update(bool overflow, int64_t step) {
    if (!enabled_) return !overflow;
    if (overflow) {
        ++overflows_;
        ++skipped_;
        ++consecutive_;
        clean_ = 0;
        scale_ *= opt_.backoff_factor;
        if (scale_ < opt_.min_scale) {
            throw Error(fmt::format(
                "fp16 loss scale fell to {} (below train.loss_scale_min = {}) at step {} after {} "
                "overflowing steps in a row: the gradients overflow even without scaling, so the "
                "run has diverged or exceeds fp16's range; lower train.lr, or train in bf16",
                scale_, opt_.min_scale, step, consecutive_));
        }
        return false;
    }
    consecutive_ = 0;
    if (++clean_ >= opt_.growth_interval) {
        scale_ *= opt_.growth_factor;
        clean_ = 0;
        ++growths_;
    }
    return true;
}

nlohmann::json LossScaler::state() const {
    return {{"enabled", enabled_}, {"scale", scale_}, {"clean_streak", clean_},
            {"skipped_steps", skipped_}, {"overflows", overflows_}, {"growths", growths_}};
}

void LossScaler::restore(const nlohmann::json& s) {
    try {
        scale_ = s.at("scale").get<double>();
        clean_ = s.at("clean_streak").get<int64_t>();
        skipped_ = s.at("skipped_steps").get<int64_t>();
        overflows_ = s.at("overflows").get<int64_t>();
        growths_ = s.at("growths").get<int64_t>();
    } catch (const nlohmann::json::exception& e) {
        throw IoError(fmt::format("loss scaler state is malformed: {}", e.what()));
    }
}

}  // namespace apiary::optim
