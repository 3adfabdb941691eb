#include "core/parallelism.h"

#include <fmt/format.h>

#include "core/error.h"

namespace apiary::core {

PipelineSchedule parse_pipeline_schedule(const std::string& name) {
    if (name == "gpipe") return PipelineSchedule::gpipe;
    if (name == "1f1b") return PipelineSchedule::one_f_one_b;
    if (name == "interleaved") return PipelineSchedule::interleaved;
    throw ConfigError(fmt::format(
        "parallel.schedule = '{}': known schedules are gpipe, 1f1b and interleaved", name));
}

const char* pipeline_schedule_name(PipelineSchedule s) {
    switch (s) {
        case PipelineSchedule::gpipe:
            return "gpipe";
        case PipelineSchedule::one_f_one_b:
            return "1f1b";
        case PipelineSchedule::interleaved:
            return "interleaved";
    }
    return "?";
}

Recompute parse_recompute(const std::string& name) {
    if (name == "none") return Recompute::none;
    if (name == "selective") return Recompute::selective;
    if (name == "full") return Recompute::full;
    throw ConfigError(
        fmt::format("parallel.recompute = '{}': known modes are none, selective "
                    "(the attention core) and full (every block)",
                    name));
}

const char* recompute_name(Recompute r) {
    switch (r) {
        case Recompute::none:
            return "none";
        case Recompute::selective:
            return "selective";
        case Recompute::full:
            return "full";
    }
    return "?";
}

}  // namespace apiary::core
