#include "plan/planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/stage_split.h"
#include "plan/calibrate.h"
#include "plan/memory.h"
#include "plan/step_time.h"
#include "plan/totals.h"

namespace apiary::plan {

namespace {
constexpr double kGiB = 1024.0 * 1024 * 1024;
}

const char* algo_name(Algo a) {
    switch (a) {
        case Algo::automatic:
            return "auto";
        case Algo::ring:
            return "ring";
        case Algo::tree:
            return "tree";
        case Algo::hierarchical:
            return "hierarchical";
    }
    return "?";
}
Algo parse_algo(const std::string& s) {
    for (Algo a : {Algo::automatic, Algo::ring, Algo::tree, Algo::hierarchical}) {
        if (s == algo_name(a)) return a;
    }
    throw ConfigError(fmt::format(
        "cluster.collective: unknown value '{}' (known: auto, ring, tree, hierarchical)", s));
}

const char* impl_name(Impl i) {
    switch (i) {
        case Impl::megatron:
            return "megatron";
        case Impl::megatron2019:
            return "megatron-2019";
        case Impl::deepspeed:
            return "deepspeed";
        case Impl::fsdp:
            return "fsdp";
        case Impl::apiary:
            return "apiary";
    }
    return "?";
}
Impl parse_impl(const std::string& s) {
    for (Impl i : {Impl::megatron, Impl::megatron2019, Impl::deepspeed, Impl::fsdp, Impl::apiary}) {
        if (s == impl_name(i)) return i;
    }
    throw ConfigError(fmt::format(
        "cluster.implementation: unknown value '{}' (known: megatron, megatron-2019, deepspeed, "
        "fsdp, apiary)",
        s));
}

namespace {

// Fractions of the catalog's (Megatron-fitted) GEMM efficiency that the
// other stacks reach, fitted on the validation set's fit split
// (tests/plan/validation.toml; `apiary plan validate --fit`): DeepSpeed's
// pipeline engine on MT-NLG 530B, PyTorch FSDP on MosaicML's MPT runs,
// Megatron-LM's 2019 code on its own single-V100 baseline (Shoeybi et al.
// 2019, Section 5.1: 39 TFLOP/s where the 2020 V1.0 code ran 62).
constexpr double kDeepSpeedEff = 0.81;
constexpr double kFsdpEff = 0.88;
constexpr double kMegatron2019Eff = 0.49;
// Host seconds per kernel launch in PyTorch eager with Transformer Engine
// (Python dispatch, autograd bookkeeping, the CUDA launch itself; a few to
// tens of microseconds per operator), fitted on the fit split's dropless MoE
// runs (Megatron-Bridge 26.02, Qwen3-30B-A3B).
constexpr double kLaunchS = 33e-6;
// Bytes PyTorch's caching allocator holds per byte of live activations
// (fragmentation of freed blocks of other sizes), fitted on the fit split's
// published peak reserved memory (torchtitan, docs/performance.md).
constexpr double kAllocFrac = 0.33;

}  // namespace

void apply_profile(Cluster& c, Impl impl) {
    c.impl = impl;
    c.impl_eff = 1.0, c.pp_scatter = true, c.moe_overlap = 0, c.cp_overlap = 1;
    c.dp_overlap = c.dev.dp_overlap, c.zero3_gathers = 1, c.launch_s = kLaunchS;
    c.fused_ce = true, c.alloc_frac = c.dev.kind == "cpu" ? 0.0 : kAllocFrac;
    c.pp_wire_bytes = 0, c.zero2_per_micro = false, c.selective_reruns_attention = false;
    c.head_rows = 0, c.head_rows_tp = 0, c.grad_scratch = false;
    switch (impl) {
        case Impl::megatron:
            break;
        case Impl::megatron2019:
            // Megatron-LM 2019: no fused kernels yet, and its local
            // DistributedDataParallel all-reduces the gradients after
            // backward (model.allreduce_params in the training step).
            c.impl_eff = kMegatron2019Eff, c.dp_overlap = 0;
            break;
        case Impl::deepspeed:
            // Pipeline engine: whole activations between stages, gradient
            // reduction after the last micro-batch; ZeRO-3 gathers each
            // parameter tensor (Rajbhandari et al. 2021).
            c.impl_eff = kDeepSpeedEff, c.pp_scatter = false, c.dp_overlap = 0;
            c.zero3_gathers = 0;
            break;
        case Impl::fsdp:
            // One flat parameter per block, gathered ahead of use and
            // reduce-scattered behind backward (Zhao et al. 2023); the loss
            // is PyTorch's cross entropy on upcast logits.
            c.impl_eff = kFsdpEff, c.pp_scatter = false, c.fused_ce = false;
            break;
        case Impl::apiary:
            // This project's trainer (src/parallel/): gradients reduced after
            // backward on CPU ranks, every tensor-parallel rank sends the whole
            // fp32 activation to the next stage, ZeRO-3 gathers one flat unit
            // per block, ZeRO-2 reduce-scatters on every micro-step, selective
            // recomputation reruns the attention core's forward (its output and
            // log-sum-exp are not kept), its own allocator.
            c.pp_scatter = false, c.dp_overlap = 0, c.zero3_gathers = 1, c.alloc_frac = 0;
            c.pp_wire_bytes = 4, c.zero2_per_micro = true, c.selective_reruns_attention = true;
            c.head_rows = 512, c.head_rows_tp = 256, c.grad_scratch = true;
            break;
    }
}

namespace {

// "1gbit", "800mbit", "25Gbit", "3.125GB/s", "500MB/s" -> bytes/s. Bit rates
// are read as tc writes them (decimal: 1gbit = 1e9 bit/s).
double parse_rate(const std::string& text, const char* key) {
    size_t pos = 0;
    double v = 0;
    try {
        v = std::stod(text, &pos);
    } catch (const std::exception&) {
        pos = 0;
    }
    std::string unit = text.substr(pos);
    std::transform(unit.begin(), unit.end(), unit.begin(),
                   [](unsigned char ch) { return std::tolower(ch); });
    static const std::pair<const char*, double> units[] = {
        {"bit", 1.0 / 8},   {"kbit", 1e3 / 8}, {"mbit", 1e6 / 8}, {"gbit", 1e9 / 8},
        {"tbit", 1e12 / 8}, {"b/s", 1},        {"kb/s", 1e3},     {"mb/s", 1e6},
        {"gb/s", 1e9},      {"tb/s", 1e12}};
    for (const auto& [name, mult] : units) {
        if (pos > 0 && unit == name && v > 0 && std::isfinite(v)) return v * mult;
    }
    throw ConfigError(fmt::format(
        "{}: '{}' is not a link rate (a positive number with a unit: 1gbit, 800mbit, 25gbit as "
        "tc writes them, or 3.125GB/s, 500MB/s in bytes)",
        key, text));
}

// "100us", "5ms", "0.002s", "800ns" -> seconds.
double parse_latency(const std::string& text, const char* key) {
    size_t pos = 0;
    double v = -1;
    try {
        v = std::stod(text, &pos);
    } catch (const std::exception&) {
        pos = 0;
    }
    const std::string unit = text.substr(pos);
    static const std::pair<const char*, double> units[] = {
        {"ns", 1e-9}, {"us", 1e-6}, {"ms", 1e-3}, {"s", 1}};
    for (const auto& [name, mult] : units) {
        if (pos > 0 && unit == name && v >= 0 && std::isfinite(v)) return v * mult;
    }
    throw ConfigError(fmt::format(
        "{}: '{}' is not a latency (a number with a unit: 800ns, 100us, 5ms, 0.002s)", key, text));
}

// The links' rate and latency as the user measured or shaped them, over
// the catalog's and the calibration's (explicit keys win over both).
void apply_link_overrides(const core::Config& cfg, Cluster& c, long long devices) {
    if (const auto& v = cfg.get_string("cluster.intra_link_rate"); !v.empty()) {
        c.intra.bw = parse_rate(v, "cluster.intra_link_rate"), c.intra.efficiency = 1;
        c.intra.name += " at " + v;
    }
    if (const auto& v = cfg.get_string("cluster.intra_link_latency"); !v.empty()) {
        c.intra.latency = parse_latency(v, "cluster.intra_link_latency");
    }
    if (const auto& v = cfg.get_string("cluster.inter_link_rate"); !v.empty()) {
        c.inter.bw = parse_rate(v, "cluster.inter_link_rate"), c.inter.efficiency = 1;
        c.inter.name += " at " + v;
    }
    if (const auto& v = cfg.get_string("cluster.inter_link_latency"); !v.empty()) {
        c.inter.latency = parse_latency(v, "cluster.inter_link_latency");
    }
    if (auto v = cfg.get_real("cluster.inter_link_efficiency"); v > 0) c.inter.efficiency = v;
    if (cfg.get_bool("cluster.nic_shared")) {
        // Every rank of a node sends through the node's one link at once in
        // the collectives that matter (rings per rank, all-to-alls), so each
        // is priced at an equal part of it.
        const long long per_node =
            std::max<long long>(1, std::min<long long>(devices, c.dev.devices_per_node));
        c.inter.bw /= double(per_node);
        c.inter.name += fmt::format(" shared by {}", per_node);
    }
}

}  // namespace

void add_keys(core::Schema& s) {
    s.add_string("cluster.device", "epyc-zen5-2c",
                 "accelerator from the catalog (`apiary plan devices` lists them)");
    s.add_int("cluster.gpus", 0, "devices in the cluster (0: parallel.tp * pp * dp, or 1)", 0, 1e8);
    s.add_int("cluster.gpus_per_node", 0, "devices per node (0: the device's usual node)", 0, 1e5);
    s.add_string("cluster.intra_link", "", "link inside a node (empty: the device's)");
    s.add_string("cluster.inter_link", "", "per-device link between nodes (empty: the device's)");
    s.add_string("cluster.intra_link_rate", "",
                 "rate of the link inside a node per device, one direction, as tc writes it "
                 "(40gbit, 800mbit) or in bytes (8GB/s, 500MB/s); empty: the link's");
    s.add_string("cluster.intra_link_latency", "",
                 "latency per step of a collective inside a node (5us, 0.2ms); empty: the link's");
    s.add_string("cluster.inter_link_rate", "",
                 "rate of the link between nodes, one direction: per device, or per node with "
                 "cluster.nic_shared (1gbit, 25gbit, 3.125GB/s); empty: the link's");
    s.add_string("cluster.inter_link_latency", "",
                 "latency per step of a collective between nodes (100us, 5ms); empty: the link's");
    s.add_real("cluster.inter_link_efficiency", 0,
               "fraction of cluster.inter_link_rate a collective sustains (TCP over Ethernet: "
               "about 0.95 of the wire rate); 0: 1 with a rate given, else the link's",
               0, 1);
    s.add_bool("cluster.nic_shared", false,
               "the ranks of a node share one network link of cluster.inter_link_rate (CPU nodes, "
               "the test cluster of network namespaces): each gets an equal part; false: one "
               "link per device, as GPU nodes have");
    s.add_string("cluster.topology", "",
                 "network above the node: fat-tree, fat-tree-2to1, rail-optimized, dragonfly+, "
                 "dcn (empty: the device's)");
    s.add_string("cluster.collective", "auto", "all-reduce algorithm",
                 {"auto", "ring", "tree", "hierarchical"});
    s.add_real("cluster.peak_tflops", 0, "override the dense peak at train.precision (0: catalog)",
               0, 1e7);
    s.add_real("cluster.mem_gib", 0, "override device memory in GiB (0: catalog)", 0, 1e6);
    s.add_real("cluster.mem_bw_gbs", 0, "override memory bandwidth in GB/s (0: catalog)", 0, 1e6);
    s.add_real("cluster.gemm_eff", 0,
               "override the achievable fraction of peak for large GEMMs (0: catalog)", 0, 1);
    s.add_real("cluster.dp_overlap", -1,
               "fraction of a micro-batch's backward that can hide DP communication "
               "(-1: the device's: 1 for GPUs, 0 for CPU ranks)",
               -1, 1);
    s.add_string("cluster.implementation", "auto",
                 "software stack: megatron, megatron-2019, deepspeed, fsdp or apiary "
                 "(docs/planner.md); auto: apiary on a CPU device, megatron on accelerators",
                 {"auto", "megatron", "megatron-2019", "deepspeed", "fsdp", "apiary"});
    s.add_int("cluster.zero3_gathers_per_block", -1,
              "ZeRO-3 all-gathers per block: 1 for FSDP-style flat parameters, 0 for one per "
              "weight tensor (12 for GPT, 9 for LLaMA); -1: the implementation's",
              -1, 1000);
    s.add_real("cluster.moe_overlap", -1,
               "fraction of the expert all-to-all hidden behind compute (-1: the "
               "implementation's, 0)",
               -1, 1);
    s.add_real("cluster.cp_overlap", -1,
               "fraction of the context-parallel key/value exchange hidden behind attention (-1: "
               "the implementation's, 1 for ring attention; 0 for an all-gather of K and V "
               "before attention, as Llama 3 did)",
               -1, 1);
    s.add_string("plan.attention", "flash",
                 "attention kernel: flash (fused, no stored scores; every run since 2022) or "
                 "materialized (scores stored, as Megatron-LM 2021-2022)",
                 {"flash", "materialized"});
    s.add_real("plan.capacity_factor", 1.0,
               "tokens each expert computes relative to an even split (GShard/Switch capacity; "
               "load imbalance of a dropless router)",
               1.0, 16.0);
    s.add_real("cluster.price_per_hour", 0, "USD per device-hour on demand (0: catalog)", 0, 1e6);
    s.add_real("cluster.spot_price_per_hour", 0, "USD per device-hour on spot (0: catalog)", 0,
               1e6);
    s.add_bool("cluster.spot", false, "run on spot / preemptible capacity");
    s.add_real("cluster.spot_preemptions_per_node_hour", 0.002,
               "spot preemptions per node-hour (each restarts the job)", 0, 10);
    s.add_real("cluster.mtbf_node_hours", 6000,
               "mean time between failures of one node, hours (Llama 3: ~6,000)", 1e-3, 1e9);
    s.add_real("cluster.checkpoint_s", 0, "time to write a checkpoint (0: size / checkpoint_gbs)",
               0, 1e6);
    s.add_real("cluster.checkpoint_gbs", 2.0, "checkpoint write bandwidth per device, GB/s", 1e-3,
               1e4);
    s.add_real("cluster.restart_s", 600, "time to restart after a failure or preemption", 0, 1e6);
    s.add_real("cluster.pue", 1.1, "data-centre power usage effectiveness", 1, 5);
    s.add_real("cluster.idle_frac", 0.3, "device power when idle, as a fraction of TDP", 0, 1);
    s.add_real("cluster.network_w_per_device", 30, "switch and NIC power per device, W", 0, 1e4);
    s.add_real("cluster.host_w_per_node", -1,
               "CPU, memory and fan power per node, W (-1: the device's node)", -1, 1e6);
    s.add_real("cluster.gco2_per_kwh", 400, "grid carbon intensity, gCO2e/kWh", 0, 5000);
    s.add_string("cluster.carbon_profile", "",
                 "file of hourly gCO2e/kWh values, one per line (repeats); empty: constant");
    s.add_real("cluster.start_hour", 0, "hour of the carbon profile at which the run starts", 0,
               1e6);
    s.add_real("plan.tokens", 0, "tokens to train on, for time-to-train and totals", 0, 1e18);
    s.add_int("plan.global_batch", 0,
              "sequences per optimizer step (0: train.batch_size * train.grad_accum * dp)", 0, 1e9);
    s.add_string("plan.calibration", "", "calibration file from `apiary plan calibrate`");
}

Cluster cluster_from(const core::Config& cfg, long long devices) {
    Cluster c;
    c.dev = device(cfg.get_string("cluster.device"));
    Device& d = c.dev;
    auto pick = [&](const char* key, const std::string& def) {
        const auto& v = cfg.get_string(key);
        return v.empty() ? def : v;
    };
    c.intra = link(pick("cluster.intra_link", d.intra_link));
    c.inter = link(pick("cluster.inter_link", d.inter_link));
    c.topo = topology(pick("cluster.topology", d.topology));
    // Measured constants first, then explicit overrides win over both.
    if (const auto& f = cfg.get_string("plan.calibration"); !f.empty()) {
        apply_calibration(read_calibration(f), c);
    }
    if (auto v = cfg.get_int("cluster.gpus_per_node"); v > 0) d.devices_per_node = int(v);
    apply_link_overrides(cfg, c, devices);
    if (auto v = cfg.get_real("cluster.mem_gib"); v > 0) d.mem_bytes = v * kGiB;
    if (auto v = cfg.get_real("cluster.mem_bw_gbs"); v > 0) d.mem_bw = v * 1e9;
    if (auto v = cfg.get_real("cluster.gemm_eff"); v > 0) d.gemm_eff = v;
    if (auto v = cfg.get_real("cluster.host_w_per_node"); v >= 0) d.host_w_per_node = v;
    if (auto v = cfg.get_real("cluster.peak_tflops"); v > 0) {
        d.peak_fp32 = d.peak_tf32 = d.peak_bf16 = d.peak_fp16 = d.peak_fp8 = v * 1e12;
    }
    c.n = devices;
    c.algo = parse_algo(cfg.get_string("cluster.collective"));
    const std::string& impl = cfg.get_string("cluster.implementation");
    // Only this project's trainer runs on a CPU device; accelerators are
    // described by the stack the catalog's constants were fitted on.
    apply_profile(
        c, impl == "auto" ? (d.kind == "cpu" ? Impl::apiary : Impl::megatron) : parse_impl(impl));
    if (auto v = cfg.get_real("cluster.dp_overlap"); v >= 0) c.dp_overlap = v;
    if (auto v = cfg.get_int("cluster.zero3_gathers_per_block"); v >= 0) c.zero3_gathers = int(v);
    if (auto v = cfg.get_real("cluster.moe_overlap"); v >= 0) c.moe_overlap = v;
    if (auto v = cfg.get_real("cluster.cp_overlap"); v >= 0) c.cp_overlap = v;
    c.pue = cfg.get_real("cluster.pue");
    c.idle_frac = cfg.get_real("cluster.idle_frac");
    c.network_w_per_device = cfg.get_real("cluster.network_w_per_device");
    c.gco2_per_kwh = cfg.get_real("cluster.gco2_per_kwh");
    c.start_hour = cfg.get_real("cluster.start_hour");
    if (const auto& f = cfg.get_string("cluster.carbon_profile"); !f.empty()) {
        std::ifstream in(f);
        if (!in) {
            throw IoError(fmt::format("cluster.carbon_profile: cannot read '{}'", f));
        }
        std::string line;
        int n = 0;
        while (std::getline(in, line)) {
            ++n;
            if (line.empty() || line[0] == '#') continue;
            try {
                c.gco2_profile.push_back(std::stod(line));
            } catch (const std::exception&) {
                throw ConfigError(fmt::format(
                    "cluster.carbon_profile {}:{}: '{}' is not a number of gCO2e/kWh", f, n, line));
            }
        }
        if (c.gco2_profile.empty()) {
            throw ConfigError(fmt::format("cluster.carbon_profile {}: no hourly values", f));
        }
    }
    c.price_hour = cfg.get_real("cluster.price_per_hour");
    if (c.price_hour <= 0) c.price_hour = d.price_hour;
    c.spot_price_hour = cfg.get_real("cluster.spot_price_per_hour");
    if (c.spot_price_hour <= 0) c.spot_price_hour = d.spot_price_hour;
    c.spot = cfg.get_bool("cluster.spot");
    c.spot_preempt_per_node_hour = cfg.get_real("cluster.spot_preemptions_per_node_hour");
    c.mtbf_node_hours = cfg.get_real("cluster.mtbf_node_hours");
    c.ckpt_write_s = cfg.get_real("cluster.checkpoint_s");
    c.ckpt_bw = cfg.get_real("cluster.checkpoint_gbs") * 1e9;
    c.restart_s = cfg.get_real("cluster.restart_s");
    return c;
}

std::string layout_problem(const Workload& w, const Layout& l) {
    const auto& m = w.model;
    if (m.n_head % l.tp != 0) {
        return fmt::format("parallel.tp = {} does not divide model.n_head = {}", l.tp, m.n_head);
    }
    if (!m.mla() && (l.tp > m.n_kv_head ? l.tp % m.n_kv_head != 0 : m.n_kv_head % l.tp != 0)) {
        return fmt::format("parallel.tp = {} and model.n_kv_head = {}: one must divide the other",
                           l.tp, m.n_kv_head);
    }
    if (m.ffn_dim() % l.tp != 0 || (m.moe() && m.expert_ffn_dim() % l.tp != 0)) {
        return fmt::format("parallel.tp = {} does not divide the MLP width {}", l.tp,
                           m.moe() ? m.expert_ffn_dim() : m.ffn_dim());
    }
    if (l.cp > 1 && w.seq_len % (2 * l.cp) != 0) {
        return fmt::format(
            "parallel.cp = {} needs train.seq_len = {} divisible by 2 x cp (each rank takes two "
            "chunks, one early and one late, to balance the causal mask)",
            l.cp, w.seq_len);
    }
    if (l.ep > 1 && !m.moe()) {
        return fmt::format("parallel.ep = {} but the model has no experts (model.n_expert = 0)",
                           l.ep);
    }
    if (m.moe() && m.n_expert % l.ep != 0) {
        return fmt::format("parallel.ep = {} does not divide model.n_expert = {}", l.ep,
                           m.n_expert);
    }
    if (l.dp % l.ep != 0) {
        return fmt::format(
            "parallel.ep = {} does not divide the {} data-parallel ranks it is carved from", l.ep,
            l.dp);
    }
    if (l.schedule == PipelineSchedule::interleaved && l.pp == 1) {
        return "parallel.schedule = interleaved needs parallel.pp > 1 (there is no pipeline to "
               "interleave): use 1f1b";
    }
    const int chunks = l.schedule == PipelineSchedule::interleaved ? l.vpp : 1;
    // Uneven stages and chunks are allowed (the fullest one is costed), as
    // Megatron-Core and DeepSpeed balance them; every chunk needs a block.
    if (l.pp * chunks > m.n_layer) {
        return fmt::format(
            "parallel.pp = {}{} is more than model.n_layer = {}: a stage needs a block", l.pp,
            chunks > 1 ? fmt::format(" x {} virtual stages", chunks) : "", m.n_layer);
    }
    if (w.global_batch % (l.dp * l.micro_batch) != 0) {
        return fmt::format(
            "global batch {} is not divisible by dp {} x micro-batch {} (train.batch_size)",
            w.global_batch, l.dp, l.micro_batch);
    }
    const long long n_micro = w.global_batch / (l.dp * l.micro_batch);
    if (chunks > 1 && n_micro % l.pp != 0) {
        return fmt::format(
            "parallel.schedule = interleaved needs the {} micro-batches per step to be a "
            "multiple of parallel.pp = {} (Megatron-LM's rule)",
            n_micro, l.pp);
    }
    return "";
}

PlanInput plan_input(const core::Config& cfg) { return resolve_input(cfg, true); }

PlanInput search_input(const core::Config& cfg) { return resolve_input(cfg, false); }

PlanInput resolve_input(const core::Config& cfg, bool check_layout) {
    PlanInput in;
    Workload& w = in.w;
    Layout& l = in.l;
    w.model = core::model_spec_from(cfg);
    w.seq_len = int(cfg.get_int("train.seq_len"));
    w.dtype = parse_dtype(cfg.get_string("train.precision"));
    w.tokens = cfg.get_real("plan.tokens");
    w.flash = cfg.get_string("plan.attention") == "flash";
    w.capacity_factor = cfg.get_real("plan.capacity_factor");
    if (w.seq_len > w.model.max_seq_len) {
        throw ConfigError(fmt::format(
            "train.seq_len = {} is longer than the model's model.max_seq_len = {} (its position "
            "table): shorten the sequence or raise model.max_seq_len",
            w.seq_len, w.model.max_seq_len));
    }
    l.tp = int(cfg.get_int("parallel.tp"));
    l.pp = int(cfg.get_int("parallel.pp"));
    l.cp = int(cfg.get_int("parallel.cp"));
    l.ep = int(cfg.get_int("parallel.ep"));
    l.zero = int(cfg.get_int("parallel.zero_stage"));
    l.recompute = core::parse_recompute(cfg.get_string("parallel.recompute"));
    l.sp = cfg.get_bool("parallel.sequence_parallel") && l.tp > 1;
    if (cfg.get_bool("parallel.sequence_parallel") && l.tp == 1) {
        in.warnings.push_back(
            "parallel.sequence_parallel = true is ignored: it shards along tensor-parallel "
            "ranks and parallel.tp = 1");
    }
    if (cfg.get_string("parallel.layout") == "auto") {
        in.warnings.push_back(
            "parallel.layout = auto is the trainer's choice at launch; this plan prices the "
            "parallel.* keys as given (`apiary plan search` ranks every layout, as auto does)");
    }
    if (cfg.get_string("parallel.axis_order") != core::kAxisOrder) {
        in.warnings.push_back(fmt::format(
            "parallel.axis_order = '{}' is not used by the planner: it places ranks tp, cp, dp "
            "(ep inside dp), pp, as Megatron-Core does and as the trainer does by default ({})",
            cfg.get_string("parallel.axis_order"), core::kAxisOrder));
    }
    l.schedule = core::parse_pipeline_schedule(cfg.get_string("parallel.schedule"));
    l.vpp = l.schedule == PipelineSchedule::interleaved
                ? int(cfg.get_int("parallel.virtual_stages"))
                : 1;
    l.micro_batch = int(cfg.get_int("train.batch_size"));
    const long long model_par = (long long)l.tp * l.cp * l.pp;
    long long n = cfg.get_int("cluster.gpus");
    long long dp = cfg.get_int("parallel.dp");
    if (n == 0) n = model_par * std::max<long long>(1, dp);
    if (!check_layout) {
        // Search varies the layout: keep only the device count and batch.
        if (dp == 0 || dp * model_par != n) dp = std::max<long long>(1, n / model_par);
    } else if (dp == 0) {
        if (n % model_par != 0) {
            throw ConfigError(fmt::format(
                "cluster.gpus = {} is not divisible by parallel.tp x cp x pp = {} x {} x {}: "
                "choose tp, cp and pp whose product divides the device count",
                n, l.tp, l.cp, l.pp));
        }
        dp = n / model_par;
    } else if (dp * model_par != n) {
        throw ConfigError(
            fmt::format("parallel.tp x cp x pp x dp = {} x {} x {} x {} = {} but cluster.gpus = {}",
                        l.tp, l.cp, l.pp, dp, dp * model_par, n));
    }
    l.dp = dp;
    const long long gb = cfg.get_int("plan.global_batch");
    w.global_batch = gb > 0 ? gb : l.micro_batch * cfg.get_int("train.grad_accum") * dp;
    in.c = cluster_from(cfg, n);
    // apiary's trainer has no dropout: its blocks store no masks.
    w.dropout = in.c.impl != Impl::apiary;
    const std::string& stages = cfg.get_string("parallel.stage_layers");
    if (!check_layout) {
        if (!stages.empty()) {
            in.warnings.push_back(fmt::format(
                "parallel.stage_layers = '{}' is not used by plan search: it varies pp and "
                "splits the blocks as the implementation does",
                stages));
        }
        return in;
    }
    if (auto p = layout_problem(w, l); !p.empty()) throw ConfigError(p);
    if (!stages.empty()) {
        l.stage_layers = core::parse_stage_layers(stages, w.model, l.pp * l.vpp, l.vpp > 1);
    }
    l.n_micro = w.global_batch / (l.dp * l.micro_batch);
    if (auto mb = cfg.get_int("parallel.microbatches"); mb > 0 && mb != l.n_micro) {
        throw ConfigError(fmt::format(
            "parallel.microbatches = {} but global batch {} / (dp {} x micro-batch {}) = {}", mb,
            w.global_batch, l.dp, l.micro_batch, l.n_micro));
    }
    if (l.zero > 0 && l.dp * l.cp == 1) {
        in.warnings.push_back(fmt::format(
            "parallel.zero_stage = {} is ignored: there is one data-parallel rank to shard over",
            l.zero));
        l.zero = 0;
    }
    return in;
}

std::vector<std::string> plan_warnings(const Workload& w, const Layout& l, const Cluster& c,
                                       const Totals& t) {
    std::vector<std::string> v;
    const Device& d = c.dev;
    if (w.dtype == Dtype::fp8 && d.peak_fp8 <= 0) {
        v.push_back(fmt::format("{} has no fp8 matrix units: fp8 is costed at its {} peak", d.name,
                                d.peak_bf16 > 0 ? "bf16" : "fp16"));
    }
    if (w.dtype == Dtype::bf16 && d.peak_bf16 <= 0) {
        v.push_back(
            fmt::format("{} has no bf16 matrix units: bf16 is costed at its fp32 peak "
                        "(use train.precision = fp16)",
                        d.name));
    }
    if (l.tp > c.ranks_per_node()) {
        v.push_back(fmt::format(
            "tensor parallelism spans nodes (parallel.tp = {} > {} devices per node): every "
            "block's all-reduces cross the network",
            l.tp, c.ranks_per_node()));
    }
    if (w.flash && l.recompute == Recompute::selective && !c.selective_reruns_attention) {
        v.push_back(
            "parallel.recompute = selective recomputes the attention scores, which fused "
            "attention (plan.attention = flash) never stores: it changes nothing");
    }
    if (!w.model.moe() && w.capacity_factor != 1.0) {
        v.push_back("plan.capacity_factor is ignored: the model has no experts");
    }
    if (w.tokens > 0 && !(t.goodput > 0)) {
        v.push_back(fmt::format(
            "goodput is 0: {} nodes fail about every {:.3g} s, sooner than a checkpoint and "
            "restart take; the run never finishes (raise cluster.mtbf_node_hours, or shorten "
            "cluster.checkpoint_s / cluster.restart_s)",
            c.nodes(), 3600 * c.mtbf_node_hours / double(c.nodes())));
    }
    return v;
}

Plan evaluate(const Workload& w, const Layout& l, const Cluster& c) {
    Plan p;
    p.w = w;
    p.l = l;
    p.mem = memory_per_device(w, l, c);
    p.st = step_time(w, l, c);
    p.tot = run_totals(w, l, c, p.st, p.mem);
    p.fits = p.mem.fits();
    p.warnings = plan_warnings(w, l, c, p.tot);
    if (!p.fits) {
        p.why = fmt::format(
            "needs {:.1f} GiB per device (params {:.1f}, grads {:.1f}, optimizer {:.1f}, "
            "activations {:.1f}, buffers {:.1f}, allocator {:.1f}, runtime {:.1f}) but {} has "
            "{:.1f} GiB",
            p.mem.total() / kGiB, p.mem.params / kGiB, p.mem.grads / kGiB, p.mem.optimizer / kGiB,
            p.mem.activations / kGiB, p.mem.buffers / kGiB, p.mem.allocator / kGiB,
            p.mem.runtime / kGiB, c.dev.name, p.mem.capacity / kGiB);
    }
    return p;
}

std::string layout_string(const Layout& l) {
    std::string s = fmt::format("tp={} ", l.tp);
    if (l.cp > 1) s += fmt::format("cp={} ", l.cp);
    s += fmt::format("pp={} dp={} ", l.pp, l.dp);
    if (l.ep > 1) s += fmt::format("ep={} ", l.ep);
    s += fmt::format("zero={} mb={} recompute={} {}", l.zero, l.micro_batch,
                     core::recompute_name(l.recompute), core::pipeline_schedule_name(l.schedule));
    if (l.schedule == PipelineSchedule::interleaved) s += fmt::format("x{}", l.vpp);
    if (l.sp) s += " sp";
    return s;
}

}  // namespace apiary::plan
