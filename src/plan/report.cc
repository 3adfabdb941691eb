// Reports of one plan: the --json object and the human table.

#include <fmt/format.h>

#include <cmath>

#include "plan/memory.h"
#include "plan/planner.h"

namespace apiary::plan {

namespace {
constexpr double kGiB = 1024.0 * 1024 * 1024;

// A prediction that is not finite (a run that never finishes) is null, never
// a number.
nlohmann::json num(double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(); }
}  // namespace

nlohmann::json to_json(const Plan& p, const Cluster& c) {
    using nlohmann::json;
    const auto& m = p.w.model;
    const auto& l = p.l;
    json j;
    j["model"] = {{"arch", core::arch_name(m.arch)},
                  {"params", m.num_params()},
                  {"n_layer", m.n_layer},
                  {"n_embd", m.n_embd},
                  {"n_head", m.n_head},
                  {"n_kv_head", m.n_kv_head},
                  {"vocab_size", m.vocab_size},
                  {"ffn_hidden", m.ffn_dim()},
                  {"active_params", double(m.num_active_matmul_params())},
                  {"n_expert", m.n_expert},
                  {"n_expert_active", m.n_expert_active}};
    j["cluster"] = {{"device", c.dev.name},
                    {"devices", c.n},
                    {"nodes", c.nodes()},
                    {"devices_per_node", c.ranks_per_node()},
                    {"intra_link", c.intra.name},
                    {"inter_link", c.inter.name},
                    {"topology", c.topo.name},
                    {"collective", algo_name(c.algo)},
                    {"implementation", impl_name(c.impl)},
                    {"peak_tflops", c.dev.peak(p.w.dtype) / 1e12}};
    j["layout"] = {{"tp", l.tp},
                   {"cp", l.cp},
                   {"ep", l.ep},
                   {"pp", l.pp},
                   {"dp", l.dp},
                   {"zero_stage", l.zero},
                   {"micro_batch", l.micro_batch},
                   {"microbatches", l.n_micro},
                   {"recompute", core::recompute_name(l.recompute)},
                   {"sequence_parallel", l.sp},
                   {"schedule", core::pipeline_schedule_name(l.schedule)},
                   {"virtual_stages", l.vpp}};
    j["precision"] = dtype_name(p.w.dtype);
    j["seq_len"] = p.w.seq_len;
    j["attention"] = p.w.flash ? "flash" : "materialized";
    j["warnings"] = p.warnings;
    j["global_batch"] = p.w.global_batch;
    j["tokens_per_step"] = double(p.w.global_batch) * p.w.seq_len;
    j["memory_gib"] = {
        {"params", p.mem.params / kGiB},       {"grads", p.mem.grads / kGiB},
        {"optimizer", p.mem.optimizer / kGiB}, {"activations", p.mem.activations / kGiB},
        {"buffers", p.mem.buffers / kGiB},     {"allocator", p.mem.allocator / kGiB},
        {"runtime", p.mem.runtime / kGiB},     {"total", p.mem.total() / kGiB},
        {"capacity", p.mem.capacity / kGiB}};
    j["fits"] = p.fits;
    if (!p.fits) j["why"] = p.why;
    const auto& st = p.st;
    j["step_time_s"] = num(st.total);
    j["step_time_breakdown_s"] = {{"compute", st.compute},       {"recompute", st.recompute},
                                  {"tp_comm", st.tp_comm},       {"cp_comm", st.cp_comm},
                                  {"ep_comm", st.ep_comm},       {"pp_comm", st.pp_comm},
                                  {"bubble", st.bubble},         {"dp_comm", st.dp_comm},
                                  {"dp_exposed", st.dp_exposed}, {"optimizer", st.optimizer}};
    j["bubble_fraction"] = st.bubble_fraction;
    if (l.pp > 1) {
        j["stage_blocks"] = stage_split(p.w, l, c.impl).blocks;
        j["stage_busy_s"] = st.stage_busy_s;
        j["stage_idle_max"] = st.stage_idle_max;
    }
    j["tokens_per_s"] = num(st.tokens_per_s);
    j["tflops_per_device"] = st.tflops_per_device;
    j["hw_tflops_per_device"] = st.hw_flops / st.total / double(l.devices()) / 1e12;
    j["mfu"] = st.mfu;
    j["hfu"] = st.hfu;
    j["model_flops_per_step"] = st.model_flops;
    const auto& t = p.tot;
    j["tokens"] = p.w.tokens;
    j["steps"] = t.steps;
    j["time_to_train_days"] = num(t.wall_s / 86400);
    j["ideal_time_days"] = num(t.ideal_s / 86400);
    j["goodput"] = t.goodput;
    j["checkpoint_interval_s"] = num(t.ckpt_interval_s);
    j["gpu_hours"] = num(t.gpu_hours);
    j["cost_usd"] = num(t.cost_usd);
    j["cost_on_demand_usd"] = num(t.cost_on_demand_usd);
    j["cost_spot_usd"] = num(t.cost_spot_usd);
    j["spot"] = c.spot;
    j["power_kw"] = t.power_kw;
    j["energy_kwh"] = num(t.energy_kwh);
    j["co2e_t"] = num(t.co2e_t);
    j["best_start_hour"] = t.best_start_hour;
    j["best_co2e_t"] = num(t.best_co2e_t);
    return j;
}

std::string to_table(const Plan& p, const Cluster& c) {
    const auto& m = p.w.model;
    const auto& st = p.st;
    const auto& t = p.tot;
    std::string s;
    auto line = [&](const std::string& k, const std::string& v) {
        s += fmt::format("  {:<22} {}\n", k, v);
    };
    auto pct = [&](double x) { return st.total > 0 ? 100 * x / st.total : 0.0; };
    s += fmt::format("model     {} L={} C={} NH={} V={}: {:.3g}B params", core::arch_name(m.arch),
                     m.n_layer, m.n_embd, m.n_head, m.vocab_size, double(m.num_params()) / 1e9);
    if (m.moe()) {
        s += fmt::format(" ({:.3g}B active; {} experts, top-{}, {} shared)",
                         double(m.num_active_matmul_params()) / 1e9, m.n_expert, m.n_expert_active,
                         m.n_shared_expert);
    }
    s += "\n";
    s += fmt::format("cluster   {} x {} ({} nodes, {} / {} / {})\n", c.n, c.dev.name, c.nodes(),
                     c.intra.name, c.inter.name, c.topo.name);
    s += fmt::format("layout    {} ({})\n", layout_string(p.l), impl_name(c.impl));
    s += fmt::format("batch     {} sequences x {} tokens, {} micro-batches, {}\n\n",
                     p.w.global_batch, p.w.seq_len, p.l.n_micro, dtype_name(p.w.dtype));
    for (const auto& w : p.warnings) s += fmt::format("warning: {}\n", w);
    if (!p.warnings.empty()) s += "\n";
    s += fmt::format("memory per device (GiB){}\n", p.fits ? "" : "  ** DOES NOT FIT **");
    line("params", fmt::format("{:10.2f}", p.mem.params / kGiB));
    line("grads", fmt::format("{:10.2f}", p.mem.grads / kGiB));
    line("optimizer", fmt::format("{:10.2f}", p.mem.optimizer / kGiB));
    line("activations", fmt::format("{:10.2f}", p.mem.activations / kGiB));
    line("buffers", fmt::format("{:10.2f}", p.mem.buffers / kGiB));
    line("runtime", fmt::format("{:10.2f}", p.mem.runtime / kGiB));
    line("allocator", fmt::format("{:10.2f}", p.mem.allocator / kGiB));
    line("total / capacity",
         fmt::format("{:10.2f} / {:.2f}", p.mem.total() / kGiB, p.mem.capacity / kGiB));
    if (!p.fits) s += fmt::format("  why: {}\n", p.why);
    s += fmt::format("\nstep time {:.4g} s\n", st.total);
    auto part = [&](const char* k, double v) {
        line(k, fmt::format("{:10.4g} s {:5.1f}%", v, pct(v)));
    };
    part("compute", st.compute);
    part("recompute", st.recompute);
    part("tp comm", st.tp_comm);
    if (p.l.cp > 1) part("cp comm exposed", st.cp_comm);
    if (p.l.ep > 1) part("ep all-to-all exposed", st.ep_comm);
    part("pp comm", st.pp_comm);
    part("pipeline bubble", st.bubble);
    if (p.l.pp > 1) {
        std::string blocks, busy;
        const auto split = stage_split(p.w, p.l, c.impl).blocks;
        for (size_t i = 0; i < split.size(); ++i) {
            blocks += fmt::format("{}{}", i ? "+" : "", split[i]);
            busy += fmt::format("{}{:.3g}", i ? " " : "", st.stage_busy_s[i]);
        }
        line("stages", fmt::format("blocks {}, work per step {} s; the least busy idles {:.1f}% "
                                   "of the schedule",
                                   blocks, busy, 100 * st.stage_idle_max));
    }
    part("dp comm exposed", st.dp_exposed);
    line("dp comm total", fmt::format("{:10.4g} s", st.dp_comm));
    part("optimizer", st.optimizer);
    s += fmt::format("\nthroughput\n");
    line("tokens/s", fmt::format("{:.4g}", st.tokens_per_s));
    line("TFLOP/s per device", fmt::format("{:.4g} (model FLOPs)", st.tflops_per_device));
    line("MFU / HFU", fmt::format("{:.1f}% / {:.1f}%", 100 * st.mfu, 100 * st.hfu));
    if (p.w.tokens > 0) {
        s += fmt::format("\nrun of {:.4g} tokens\n", p.w.tokens);
        if (!std::isfinite(t.wall_s)) {
            // Not a number to print: the run never finishes (see the warning).
            line("time to train", fmt::format("never: goodput 0 ({:.0f} steps needed)", t.steps));
            return s;
        }
        line("time to train",
             fmt::format("{:.2f} days ({:.0f} steps, goodput {:.1f}%, "
                         "checkpoint every {:.0f} s)",
                         t.wall_s / 86400, t.steps, 100 * t.goodput, t.ckpt_interval_s));
        line("device-hours", fmt::format("{:.4g}", t.gpu_hours));
        const std::string spot = std::isfinite(t.spot_wall_s)
                                     ? fmt::format("spot ${:.4g} taking {:.2f} days",
                                                   t.cost_spot_usd, t.spot_wall_s / 86400)
                                     : "spot never finishes";
        line("cost", fmt::format("${:.4g} on {} (on demand ${:.4g}, {})", t.cost_usd,
                                 c.spot ? "spot" : "demand", t.cost_on_demand_usd, spot));
        line("energy", fmt::format("{:.4g} kWh ({:.4g} kW with PUE)", t.energy_kwh, t.power_kw));
        line("emissions", fmt::format("{:.4g} t CO2e", t.co2e_t));
        if (!c.gco2_profile.empty()) {
            line("best start",
                 fmt::format("hour {:.0f}: {:.4g} t CO2e", t.best_start_hour, t.best_co2e_t));
        }
    }
    return s;
}

}  // namespace apiary::plan
