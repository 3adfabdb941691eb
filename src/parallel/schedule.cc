#include "parallel/schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <map>
#include <tuple>

#include "core/error.h"

namespace apiary::parallel {

namespace {

// Megatron-LM's interleaved order: the k-th forward (backward) of a stage
// runs chunk (k / p) % v (reversed for backward) on micro-batch
// (k / (p v)) p + k % p; groups of p micro-batches go through every chunk.
PipeOp interleaved_op(int k, bool forward, int p, int v) {
    const int in_group = k % (p * v);
    int chunk = in_group / p;
    if (!forward) chunk = v - 1 - chunk;
    return {forward, chunk, (k / (p * v)) * p + k % p};
}

}  // namespace

std::vector<PipeOp> pipeline_schedule(PipelineSchedule kind, int p, int stage, int m, int v) {
    APIARY_CHECK(p >= 1 && stage >= 0 && stage < p && m >= 1 && v >= 1,
                 "schedule of stage {} of {}, {} micro-batches, {} chunks", stage, p, m, v);
    APIARY_CHECK(v == 1 || kind == PipelineSchedule::interleaved,
                 "{} virtual stages need the interleaved schedule", v);
    std::vector<PipeOp> ops;
    if (kind == PipelineSchedule::gpipe) {
        for (int i = 0; i < m; ++i) ops.push_back({true, 0, i});
        for (int i = 0; i < m; ++i) ops.push_back({false, 0, i});
        return ops;
    }
    if (kind == PipelineSchedule::one_f_one_b) {
        const int warmup = std::min(p - stage - 1, m);
        for (int i = 0; i < warmup; ++i) ops.push_back({true, 0, i});
        for (int i = 0; i < m - warmup; ++i) {
            ops.push_back({true, 0, warmup + i});
            ops.push_back({false, 0, i});
        }
        for (int i = m - warmup; i < m; ++i) ops.push_back({false, 0, i});
        return ops;
    }
    APIARY_CHECK(m % p == 0,
                 "interleaved schedule: {} micro-batches is not a multiple of {} stages", m, p);
    const int total = m * v;
    const int warmup = std::min(total, (p - stage - 1) * 2 + (v - 1) * p);
    for (int k = 0; k < warmup; ++k) ops.push_back(interleaved_op(k, true, p, v));
    for (int i = 0; i < total - warmup; ++i) {
        ops.push_back(interleaved_op(warmup + i, true, p, v));
        ops.push_back(interleaved_op(i, false, p, v));
    }
    for (int k = total - warmup; k < total; ++k) ops.push_back(interleaved_op(k, false, p, v));
    return ops;
}

int slots_needed(const std::vector<PipeOp>& ops) {
    std::map<int, int> live;
    int most = 1;
    for (const auto& op : ops) {
        int& n = live[op.chunk];
        n += op.forward ? 1 : -1;
        most = std::max(most, n);
    }
    return most;
}

double ideal_bubble(int p, int m, int v) { return double(p - 1) / double(v * m + p - 1); }

std::vector<double> replay_idle(PipelineSchedule kind, int p, int m, int v,
                                const std::vector<double>& fwd, const std::vector<double>& bwd) {
    APIARY_CHECK(int(fwd.size()) == p && int(bwd.size()) == p, "{} stages, {} / {} op times", p,
                 fwd.size(), bwd.size());
    std::vector<std::vector<PipeOp>> ops(static_cast<size_t>(p));
    for (int s = 0; s < p; ++s) ops[size_t(s)] = pipeline_schedule(kind, p, s, m, v);
    const int last = p * v - 1;
    // When each (virtual stage, micro-batch)'s forward and backward ended.
    std::map<std::pair<int, int>, double> f_end, b_end;
    std::vector<size_t> at(static_cast<size_t>(p), 0);
    std::vector<double> clock(static_cast<size_t>(p), 0.0), busy(static_cast<size_t>(p), 0.0);
    for (bool moved = true; moved;) {
        moved = false;
        for (int s = 0; s < p; ++s) {
            auto& i = at[size_t(s)];
            if (i == ops[size_t(s)].size()) continue;
            const PipeOp& op = ops[size_t(s)][i];
            const int j = op.chunk * p + s;
            double ready = 0;
            if (op.forward && j > 0) {
                const auto it = f_end.find({j - 1, op.micro});
                if (it == f_end.end()) continue;
                ready = it->second;
            }
            if (!op.forward && j < last) {
                const auto it = b_end.find({j + 1, op.micro});
                if (it == b_end.end()) continue;
                ready = it->second;
            }
            const double dur = op.forward ? fwd[size_t(s)] : bwd[size_t(s)];
            const double start = std::max(clock[size_t(s)], ready);
            clock[size_t(s)] = start + dur;
            busy[size_t(s)] += dur;
            (op.forward ? f_end : b_end)[{j, op.micro}] = start + dur;
            ++i;
            moved = true;
        }
    }
    const double makespan = *std::max_element(clock.begin(), clock.end());
    std::vector<double> idle;
    for (int s = 0; s < p; ++s) idle.push_back(1.0 - busy[size_t(s)] / makespan);
    return idle;
}

std::string check_schedules(PipelineSchedule kind, int p, int m, int v) {
    std::vector<std::vector<PipeOp>> ops(static_cast<size_t>(p));
    for (int s = 0; s < p; ++s) ops[size_t(s)] = pipeline_schedule(kind, p, s, m, v);
    return check_schedules(ops, v);
}

std::string check_schedules(const std::vector<std::vector<PipeOp>>& ops, int v) {
    // Virtual stage j = chunk * p + stage; data flows j -> j + 1.
    const int p = int(ops.size());
    const int last = p * v - 1;
    // Messages in flight per (receiving virtual stage, kind): micro-batch ids
    // in send order.
    std::map<std::pair<int, bool>, std::deque<int>> wire;
    std::vector<size_t> at(static_cast<size_t>(p), 0);
    for (;;) {
        bool moved = false, done = true;
        for (int s = 0; s < p; ++s) {
            auto& i = at[size_t(s)];
            if (i == ops[size_t(s)].size()) continue;
            done = false;
            const PipeOp& op = ops[size_t(s)][i];
            const int j = op.chunk * p + s;
            // A forward needs its input from j - 1, a backward its gradient
            // from j + 1 (the first / last virtual stage needs none).
            const bool needs = op.forward ? j > 0 : j < last;
            if (needs) {
                auto& q = wire[{j, op.forward}];
                if (q.empty()) continue;  // blocked on this receive
                if (q.front() != op.micro) {
                    return fmt::format(
                        "stage {} expects micro-batch {} of virtual stage {} ({}) "
                        "but micro-batch {} arrives first",
                        s, op.micro, j, op.forward ? "forward" : "backward", q.front());
                }
                q.pop_front();
            }
            if (op.forward && j < last) wire[{j + 1, true}].push_back(op.micro);
            if (!op.forward && j > 0) wire[{j - 1, false}].push_back(op.micro);
            ++i;
            moved = true;
        }
        if (done) return "";
        if (!moved) {
            std::string where;
            for (int s = 0; s < p; ++s) {
                if (at[size_t(s)] == ops[size_t(s)].size()) continue;
                const PipeOp& op = ops[size_t(s)][at[size_t(s)]];
                where += fmt::format("{}stage {} at {}({}, mb {})", where.empty() ? "" : "; ", s,
                                     op.forward ? "F" : "B", op.chunk, op.micro);
            }
            return "deadlock: " + where;
        }
    }
}

}  // namespace apiary::parallel
