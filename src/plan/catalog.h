#pragma once
// The hardware catalog: accelerators, links and network topologies with the
// published figures the planner works from. Every entry names its source in
// catalog.cc; figures are dense (no 2:4 sparsity), per device, per direction.

#include <string>
#include <vector>

namespace apiary::plan {

enum class Dtype { fp32, tf32, bf16, fp16, fp8 };
const char* dtype_name(Dtype d);
Dtype parse_dtype(const std::string& name);  // throws ConfigError

// A point-to-point or switched link: bandwidth per device per direction.
struct Link {
    std::string name;
    double bw = 0;          // bytes/s per device, one direction
    double latency = 0;     // s, per hop of a collective step (alpha)
    double efficiency = 1;  // fraction of bw a collective library sustains
    std::string source;
};

// One tier of a network above the node: devices reachable inside it, the
// fraction of the per-device NIC bandwidth that survives the tier's taper,
// and the latency it adds to each message.
struct Tier {
    std::string name;
    long long devices = 0;  // 0: unbounded (the top tier)
    double bw_factor = 1;
    double latency = 0;
};

struct Topology {
    std::string name;
    std::vector<Tier> tiers;  // innermost first; the last one is unbounded
    std::string source;
};

struct Device {
    std::string name;
    std::string kind;  // gpu, tpu, cpu
    double peak_fp32 = 0, peak_tf32 = 0, peak_bf16 = 0, peak_fp16 = 0, peak_fp8 = 0;  // FLOP/s
    double mem_bytes = 0;
    double mem_bw = 0;  // bytes/s
    double tdp_w = 0;
    // Largest fraction of the dtype peak that big GEMMs reach in a training
    // framework (kernel efficiency and framework overheads not modelled
    // elsewhere), and the matrix dimension at which a GEMM dimension halves
    // it: eff(m, n, k) = gemm_eff * m/(m+knee) * n/(n+knee) * k/(k+knee).
    double gemm_eff = 0.7;
    double gemm_knee = 64;
    double mem_eff = 0.8;  // fraction of mem_bw that elementwise kernels reach
    // Fraction of the bf16 GEMM efficiency that fp8 GEMMs reach (scaling and
    // casts of Transformer Engine's delayed / block scaling included).
    double fp8_eff = 1.0;
    int devices_per_node = 8;    // sharing the intra-node link
    std::string intra_link;      // Link name inside a node
    std::string inter_link;      // default Link name between nodes (per device NIC)
    std::string topology;        // default Topology name
    double host_w_per_node = 0;  // CPUs, memory, fans, NICs of one node
    double reserved_bytes = 0;   // runtime context, library workspaces
    double price_hour = 0;       // USD per device-hour, on demand
    double spot_price_hour = 0;  // USD per device-hour, spot / preemptible
    // Ranks placed on one node share this device's compute and memory
    // bandwidth (a CPU: every MPI rank is a share of the same cores).
    bool shared_by_ranks = false;
    int cores = 1;  // threads one rank can use when it has the device alone (CPU cores)
    // Fraction of a micro-batch's backward that DP communication can hide
    // behind: 1 for GPU frameworks that bucket and overlap (DDP, Megatron),
    // 0 for a blocking all-reduce after backward.
    double dp_overlap = 1.0;
    std::string source;

    double peak(Dtype d) const;  // falls back to the next wider dtype when 0
};

const Device* find_device(const std::string& name);
const Device& device(const std::string& name);  // throws ConfigError listing known ones
std::vector<std::string> device_names();
const Link& link(const std::string& name);
std::vector<std::string> link_names();
const Topology& topology(const std::string& name);
std::vector<std::string> topology_names();

// "1024xA100-80GB" -> (1024, "A100-80GB"); a bare device name means count 0.
struct GpuSpec {
    long long count = 0;
    std::string device;
};
GpuSpec parse_gpus(const std::string& text);  // throws ConfigError

}  // namespace apiary::plan
