#include "plan/search.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/timing.h"
#include "plan/memory.h"
#include "plan/step_time.h"
#include "plan/totals.h"

namespace apiary::plan {

namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024;

struct Scored {
    double key;
    Layout l;
    long long n;
};

std::vector<int> pow2_divisors(long long n, int cap) {
    std::vector<int> v;
    for (long long d = 1; d <= n && d <= cap; d *= 2) {
        if (n % d == 0) v.push_back(int(d));
    }
    return v;
}

// Names the rule a layout broke, not its numbers, so that drops group.
const char* reason_of(const std::string& why) {
    if (why.rfind("parallel.tp", 0) == 0) return "tp does not divide heads / MLP";
    if (why.rfind("parallel.pp", 0) == 0) return "pp (x virtual stages) does not divide layers";
    if (why.rfind("parallel.cp", 0) == 0) return "cp does not divide the sequence";
    if (why.rfind("parallel.ep", 0) == 0) return "ep does not divide experts / dp";
    if (why.rfind("parallel.schedule", 0) == 0) {
        return "interleaved needs micro-batches divisible by pp";
    }
    return "global batch not divisible by dp x micro-batch";
}

std::vector<int> divisors(int n) {
    std::vector<int> v;
    for (int d = 1; d <= n; ++d) {
        if (n % d == 0) v.push_back(d);
    }
    return v;
}

// The schedules, micro-batches, ZeRO stages, recomputation and sequence
// parallelism for one (tp, cp, pp, dp, ep).
template <class Drop>
void search_layout(const Workload& w, const Cluster& c, const SearchOptions& opt,
                   const Layout& base, SearchResult& r, std::vector<Scored>& kept, Drop&& drop) {
    const int tp = base.tp, pp = base.pp;
    const long long dp = base.dp;
    std::vector<std::pair<PipelineSchedule, int>> scheds{{PipelineSchedule::one_f_one_b, 1}};
    if (pp > 1) {
        scheds.push_back({PipelineSchedule::gpipe, 1});
        for (int v : opt.virtual_stages) scheds.push_back({PipelineSchedule::interleaved, v});
    }
    // Fused attention stores no scores: selective recomputation is a no-op.
    std::vector<Recompute> rcs{Recompute::none, Recompute::full};
    if (!w.flash) rcs.insert(rcs.begin() + 1, Recompute::selective);
    const bool shard = dp * base.cp > 1;
    for (int mb : opt.micro_batches) {
        for (auto [sched, vpp] : scheds) {
            for (int zero = 0; zero <= (shard ? 3 : 0); ++zero) {
                for (Recompute rc : rcs) {
                    for (int sp = 0; sp <= (tp > 1 ? 1 : 0); ++sp) {
                        Layout l = base;
                        l.zero = zero, l.recompute = rc, l.sp = sp, l.micro_batch = mb;
                        l.schedule = sched, l.vpp = vpp;
                        ++r.candidates;
                        if (auto why = layout_problem(w, l); !why.empty()) {
                            // Name the rule, not the numbers, so reasons group.
                            drop(reason_of(why), l);
                            continue;
                        }
                        l.n_micro = w.global_batch / (l.dp * l.micro_batch);
                        const Memory mem = memory_per_device(w, l, c);
                        if (mem.total() < r.min_bytes) {
                            r.min_bytes = mem.total(), r.min_layout = l;
                            r.min_memory = mem;
                        }
                        if (!mem.fits()) {
                            drop("out of memory", l);
                            continue;
                        }
                        ++r.fitting;
                        const StepTime st = step_time(w, l, c);
                        double key = st.total;
                        if (opt.by_cost) {
                            // Cost for the whole run, or for one step if no tokens.
                            const Totals t = run_totals(w, l, c, st, mem);
                            key = w.tokens > 0 ? t.cost_usd : st.total * double(c.n) * c.price_hour;
                        }
                        kept.push_back({key, l, c.n});
                    }
                }
            }
        }
    }
}

}  // namespace

SearchResult search(const Workload& w, const Cluster& cluster, const SearchOptions& opt) {
    const auto t0 = core::Clock::now();
    SearchResult r;
    r.min_bytes = INFINITY;
    std::vector<Scored> kept;
    auto drop = [&](const std::string& reason, const Layout& l) {
        ++r.dropped[reason];
        if (!r.example.count(reason)) r.example[reason] = layout_string(l);
    };
    std::vector<long long> counts{cluster.n};
    if (opt.vary_devices) {
        for (long long n = cluster.n / 2; n >= 1 && n % 2 == 0; n /= 2) counts.push_back(n);
        if (cluster.n % 2 == 0) counts.push_back(1);
        std::sort(counts.begin(), counts.end());
        counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
    }
    const auto& m = w.model;
    const std::vector<int> pps = divisors(m.n_layer);
    // Context parallelism pays only for long sequences: chunks of at least
    // 1,024 tokens per rank, in two halves for the causal balance.
    std::vector<int> cps;
    for (int cp = 1; cp <= 64 && w.seq_len % (2 * cp) == 0 && w.seq_len / cp >= 1024; cp *= 2) {
        cps.push_back(cp);
    }
    if (cps.empty()) cps.push_back(1);
    const std::vector<int> eps = m.moe() ? pow2_divisors(m.n_expert, m.n_expert) : std::vector{1};
    for (long long n : counts) {
        Cluster c = cluster;
        c.n = n;
        for (int tp : pow2_divisors(n, m.n_head)) {
            for (int cp : cps) {
                for (int pp : pps) {
                    const long long model_par = (long long)tp * cp * pp;
                    if (n % model_par != 0) continue;  // not a layout of n devices
                    for (int ep : eps) {
                        if ((n / model_par) % ep != 0) continue;
                        Layout base;
                        base.tp = tp, base.cp = cp, base.pp = pp, base.ep = ep;
                        base.dp = n / model_par;
                        search_layout(w, c, opt, base, r, kept, drop);
                    }
                }
            }
        }
    }
    const size_t k = std::min<size_t>(kept.size(), size_t(std::max(0, opt.top)));
    std::partial_sort(kept.begin(), kept.begin() + long(k), kept.end(),
                      [](const Scored& a, const Scored& b) { return a.key < b.key; });
    for (size_t i = 0; i < k; ++i) {
        Cluster c = cluster;
        c.n = kept[i].n;
        r.best.push_back(evaluate(w, kept[i].l, c));
        r.best_devices.push_back(kept[i].n);
    }
    r.seconds = core::seconds_since(t0);
    return r;
}

std::string fits_nowhere(const Workload& w, const Cluster& c, const SearchResult& r) {
    const Memory& m = r.min_memory;
    std::string s = fmt::format(
        "{:.4g}B parameters fit no layout on {} x {}: the leanest ({}) needs {:.1f} GiB per "
        "device (model states {:.1f}, activations {:.1f}, buffers {:.1f}) of {:.1f} GiB",
        double(w.model.num_params()) / 1e9, c.n, c.dev.name, layout_string(r.min_layout),
        m.total() / kGiB, (m.params + m.grads + m.optimizer) / kGiB,
        (m.activations + m.allocator) / kGiB, (m.buffers + m.runtime) / kGiB, m.capacity / kGiB);
    // With ZeRO-3 and full recomputation, model states shrink as 1/devices.
    const double states = m.params + m.grads + m.optimizer;
    const double room = m.capacity - m.activations - m.allocator - m.buffers - m.runtime;
    if (room > 0 && states > 0) {
        const double need = std::ceil(double(c.n) * states / room);
        long long p2 = 1;
        while (double(p2) < need) p2 *= 2;
        s += fmt::format("; about {} devices (next power of two: {}) would hold it", need, p2);
    } else {
        s += fmt::format(
            "; activations and buffers alone exceed the device: use devices with "
            "more than {:.1f} GiB, or shorten train.seq_len",
            (m.activations + m.allocator + m.buffers + m.runtime) / kGiB);
    }
    return s;
}

}  // namespace apiary::plan
