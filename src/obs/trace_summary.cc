#include "obs/trace_summary.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace apiary::obs {

using core::trace::Kind;

namespace {

struct Node {
    const TraceSpan* span;
    int parent = -1;
    double self_s = 0;
};

// The layer a span belongs to ("" for none), with its sort order.
std::pair<std::string, int> layer_of(const TraceSpan& s) {
    if (s.layer >= 0) return {fmt::format("block {}", s.layer), 1 + s.layer};
    if (s.name.rfind("embedding", 0) == 0) return {"embedding", 0};
    if (s.name == "head") return {"head", 1 << 20};
    return {"", 0};
}

// The spans of one thread as a forest (spans sorted by begin, longest first).
std::vector<Node> build_tree(const std::vector<const TraceSpan*>& spans) {
    std::vector<Node> nodes;
    std::vector<int> stack;
    for (const TraceSpan* s : spans) {
        while (!stack.empty() && nodes[size_t(stack.back())].span->end_ns <= s->begin_ns) {
            stack.pop_back();
        }
        Node n{s, stack.empty() ? -1 : stack.back(), double(s->end_ns - s->begin_ns) * 1e-9};
        if (n.parent >= 0) {
            // A child past its parent's end (which a trace of nested scopes
            // never has) is cut at the parent's end.
            const int64_t end = std::min(s->end_ns, nodes[size_t(n.parent)].span->end_ns);
            n.self_s = double(end - s->begin_ns) * 1e-9;
            nodes[size_t(n.parent)].self_s -= n.self_s;
        }
        nodes.push_back(n);
        stack.push_back(int(nodes.size()) - 1);
    }
    return nodes;
}

struct RankResult {
    PhaseSplit split;
    std::map<std::string, LayerSplit> layers;
};

// Which part a node's own time belongs to, from itself and its ancestors.
double* part_of(const std::vector<Node>& nodes, int i, PhaseSplit& p, bool& in_step) {
    bool comm = false, eval = false, ckpt = false;
    Kind own = Kind::other;
    in_step = false;
    for (int j = i; j >= 0; j = nodes[size_t(j)].parent) {
        const Kind k = nodes[size_t(j)].span->kind;
        comm |= k == Kind::comm || k == Kind::wait;
        eval |= k == Kind::eval;
        ckpt |= k == Kind::checkpoint;
        in_step |= k == Kind::step;
        if (own == Kind::other) own = k;
    }
    if (comm) return &p.exposed_comm;
    if (eval) return &p.eval;
    if (ckpt) return &p.checkpoint;
    switch (own) {
        case Kind::compute:
            return &p.compute;
        case Kind::data:
            return &p.data_wait;
        case Kind::optimizer:
            return &p.optimizer;
        default:
            return &p.idle;  // the step itself, or spans of no known kind
    }
}

RankResult summarize_rank(const RankTrace& t) {
    RankResult out;
    PhaseSplit& p = out.split;
    int main_tid = -1;
    for (const auto& s : t.spans) {
        if (s.kind == Kind::step) {
            main_tid = s.tid;
            break;
        }
    }
    if (main_tid < 0) {
        throw DataError(fmt::format("{}: no step spans (a trace with no complete step)", t.path));
    }
    std::vector<const TraceSpan*> main, steps;
    for (const auto& s : t.spans) {
        if (s.tid == main_tid) main.push_back(&s);
        if (s.tid == main_tid && s.kind == Kind::step) steps.push_back(&s);
    }
    const std::vector<Node> nodes = build_tree(main);
    std::vector<std::pair<const TraceSpan*, std::string>> layer_spans;
    for (size_t i = 0; i < nodes.size(); ++i) {
        const TraceSpan& s = *nodes[i].span;
        if (s.kind == Kind::step && nodes[i].parent < 0) {
            p.step += double(s.end_ns - s.begin_ns) * 1e-9;
            p.steps += 1;
        }
        bool in_step = false;
        double* part = part_of(nodes, int(i), p, in_step);
        if (!in_step) continue;
        *part += nodes[i].self_s;
        for (int j = int(i); j >= 0; j = nodes[size_t(j)].parent) {
            const auto [name, order] = layer_of(*nodes[size_t(j)].span);
            if (name.empty()) continue;
            LayerSplit& l = out.layers[name];
            l.name = name;
            l.order = order;
            if (part == &p.compute) l.compute += nodes[i].self_s;
            if (part == &p.exposed_comm) l.exposed_comm += nodes[i].self_s;
            if (j == int(i)) layer_spans.push_back({&s, name});
            break;
        }
    }
    // Every collective that started inside a step, on any thread; a layer
    // gets those that started while it ran.
    for (const auto& s : t.spans) {
        if (s.kind != Kind::comm) continue;
        const bool inside = std::any_of(steps.begin(), steps.end(), [&](const TraceSpan* st) {
            return s.begin_ns >= st->begin_ns && s.begin_ns < st->end_ns;
        });
        if (!inside) continue;
        const double d = double(s.end_ns - s.begin_ns) * 1e-9;
        p.comm += d;
        for (const auto& [ls, name] : layer_spans) {
            if (s.begin_ns >= ls->begin_ns && s.begin_ns < ls->end_ns) {
                out.layers[name].comm += d;
                break;
            }
        }
    }
    return out;
}

}  // namespace

TraceSummary summarize(const std::vector<RankTrace>& ranks) {
    TraceSummary s;
    std::map<std::string, LayerSplit> layers;
    for (const auto& t : ranks) {
        s.first_step = t.meta.first_step;
        s.last_step = t.meta.last_step;
        RankResult r = summarize_rank(t);
        const double n = std::max(1, r.split.steps);
        PhaseSplit& p = r.split;
        for (double* v : {&p.step, &p.compute, &p.exposed_comm, &p.data_wait, &p.optimizer,
                          &p.checkpoint, &p.eval, &p.idle, &p.comm}) {
            *v /= n;
        }
        s.ranks.push_back({t.meta.rank, p});
        s.hosts.push_back(t.meta.host);
        for (auto& [name, l] : r.layers) {
            LayerSplit& acc = layers[name];
            acc.name = name;
            acc.order = l.order;
            acc.ranks += 1;
            acc.compute += l.compute / n;
            acc.exposed_comm += l.exposed_comm / n;
            acc.comm += l.comm / n;
        }
    }
    for (auto& [name, l] : layers) {
        l.compute /= l.ranks;
        l.exposed_comm /= l.ranks;
        l.comm /= l.ranks;
        s.layers.push_back(l);
    }
    std::sort(s.layers.begin(), s.layers.end(),
              [](const LayerSplit& a, const LayerSplit& b) { return a.order < b.order; });
    if (s.ranks.size() > 1) {
        const auto busy = [&](size_t i) {
            return std::max(0.0, s.ranks[i].second.step - s.ranks[i].second.exposed_comm);
        };
        size_t hi = 0, lo = 0;
        for (size_t i = 1; i < s.ranks.size(); ++i) {
            if (busy(i) > busy(hi)) hi = i;
            if (busy(i) < busy(lo)) lo = i;
        }
        s.straggler = {s.ranks[hi].first, s.ranks[lo].first, s.hosts[hi],
                       s.hosts[lo],       busy(hi),          busy(lo)};
    }
    return s;
}

namespace {

std::string ms_pct(double v, double of) {
    return fmt::format("{:8.2f} {:5.1f}%", 1e3 * v, of > 0 ? 100.0 * v / of : 0.0);
}

std::string ratio(double comm, double compute) {
    return compute > 0 ? fmt::format("{:.3f}", comm / compute) : "-";
}

}  // namespace

std::string format_summary(const TraceSummary& s) {
    std::string out = fmt::format(
        "steps {}-{}: milliseconds per step (share of the step time), mean over the traced "
        "steps\n\n",
        s.first_step, s.last_step);
    out += fmt::format("{:>5} {:>9} {:>15} {:>15} {:>15} {:>15} {:>15} {:>15} {:>15} {:>11}\n",
                       "rank", "step", "compute", "exposed comm", "data wait", "optimizer",
                       "checkpoint", "eval", "idle", "comm/comp");
    for (const auto& [rank, p] : s.ranks) {
        out += fmt::format(
            "{:>5} {:9.2f} {:>15} {:>15} {:>15} {:>15} {:>15} {:>15} {:>15} {:>11}\n", rank,
            1e3 * p.step, ms_pct(p.compute, p.step), ms_pct(p.exposed_comm, p.step),
            ms_pct(p.data_wait, p.step), ms_pct(p.optimizer, p.step), ms_pct(p.checkpoint, p.step),
            ms_pct(p.eval, p.step), ms_pct(p.idle, p.step), ratio(p.comm, p.compute));
    }
    if (const Straggler& g = s.straggler; g.rank >= 0) {
        const auto on = [](const std::string& h) { return h.empty() ? "" : " on " + h; };
        out += fmt::format(
            "\nslowest rank: {}{}, busy {:.2f} ms per step (the step less its exposed comm), "
            "{:.2f}x rank {}{} (the least busy, {:.2f} ms)\n",
            g.rank, on(g.host), 1e3 * g.busy, g.ratio(), g.fastest_rank, on(g.fastest_host),
            1e3 * g.fastest_busy);
    }
    out += fmt::format(
        "\nper layer (forward + backward; milliseconds per step, mean over the ranks that run "
        "it)\n{:<12} {:>6} {:>10} {:>13} {:>10} {:>11}\n",
        "layer", "ranks", "compute", "exposed comm", "comm", "comm/comp");
    for (const auto& l : s.layers) {
        out += fmt::format("{:<12} {:>6} {:10.3f} {:13.3f} {:10.3f} {:>11}\n", l.name, l.ranks,
                           1e3 * l.compute, 1e3 * l.exposed_comm, 1e3 * l.comm,
                           ratio(l.comm, l.compute));
    }
    return out;
}

std::string summary_json(const TraceSummary& s) {
    nlohmann::json ranks = nlohmann::json::array(), layers = nlohmann::json::array();
    for (size_t i = 0; i < s.ranks.size(); ++i) {
        const auto& [rank, p] = s.ranks[i];
        ranks.push_back({{"rank", rank},
                         {"host", s.hosts[i]},
                         {"steps", p.steps},
                         {"step_s", p.step},
                         {"compute_s", p.compute},
                         {"exposed_comm_s", p.exposed_comm},
                         {"data_wait_s", p.data_wait},
                         {"optimizer_s", p.optimizer},
                         {"checkpoint_s", p.checkpoint},
                         {"eval_s", p.eval},
                         {"idle_s", p.idle},
                         {"comm_s", p.comm},
                         {"parts_s", p.parts()}});
    }
    for (const auto& l : s.layers) {
        layers.push_back({{"layer", l.name},
                          {"ranks", l.ranks},
                          {"compute_s", l.compute},
                          {"exposed_comm_s", l.exposed_comm},
                          {"comm_s", l.comm}});
    }
    nlohmann::json doc{{"first_step", s.first_step},
                       {"last_step", s.last_step},
                       {"ranks", ranks},
                       {"layers", layers}};
    if (const Straggler& g = s.straggler; g.rank >= 0) {
        doc["straggler"] = {{"rank", g.rank},
                            {"host", g.host},
                            {"busy_s", g.busy},
                            {"fastest_rank", g.fastest_rank},
                            {"fastest_host", g.fastest_host},
                            {"fastest_busy_s", g.fastest_busy},
                            {"ratio", g.ratio()}};
    }
    return doc.dump(2);
}

}  // namespace apiary::obs
