#include "plan/catalog.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <charconv>
#include <map>

#include "core/error.h"

namespace apiary::plan {

namespace {

constexpr double kT = 1e12, kG = 1e9, kGiB = 1024.0 * 1024 * 1024, kUs = 1e-6;

// Achievable GEMM fractions (gemm_eff, and fp8_eff for fp8 GEMMs) are the
// fitted constants per device family, chosen by `apiary plan validate --fit`
// on the fit split of tests/plan/validation.toml and checked on its held-out
// runs: A100 0.77 (Megatron-LM 2021 Table 1, Korthikanti et al. 2022);
// H100 0.65 (Llama 3 405B on 8,192 GPUs) with fp8 at 1.03 of that (NeMo
// 24.07); V100 0.87 (Megatron-LM V1.0); B200 0.61 and Gaudi 2 0.90 from
// their fp8 runs alone (Megatron-Bridge 25.11, Intel's Llama 2 7B), so their
// fp8 GEMMs reach the same fraction of the fp8 peak. H800 and H200 share the
// H100's. The fractions sit on top of the roofline (step_time.cc: operand
// traffic is costed separately), so they are the math units' share in
// large GEMMs. MI250X, MI300X, TPUs: unvalidated estimates (no fit run);
// `apiary plan calibrate` replaces them with measured ones.
std::map<std::string, Device> make_devices() {
    std::map<std::string, Device> t;
    auto nvidia = [&](const std::string& name) -> Device& {
        Device& d = t[name];
        d.name = name, d.kind = "gpu";
        d.gemm_eff = 0.77, d.gemm_knee = 64, d.mem_eff = 0.8;
        d.reserved_bytes = 2.0 * kGiB;  // CUDA context + cuBLAS/NCCL workspaces
        d.devices_per_node = 8;
        return d;
    };
    {
        // NVIDIA A100 Tensor Core GPU datasheet (2021): 19.5 TF fp32, 156 TF
        // tf32, 312 TF bf16/fp16 dense; 40 GB HBM2 at 1,555 GB/s (80 GB HBM2e
        // at 2,039 GB/s); 400 W (SXM); NVLink 3: 600 GB/s bidirectional.
        // DGX A100 user guide: 6.5 kW max per node, 8 GPUs, 8x HDR 200 Gb/s.
        for (const char* n : {"A100-40GB", "A100-80GB"}) {
            Device& d = nvidia(n);
            d.peak_fp32 = 19.5 * kT, d.peak_tf32 = 156 * kT, d.peak_bf16 = 312 * kT;
            d.peak_fp16 = 312 * kT;
            d.tdp_w = 400, d.intra_link = "nvlink3", d.inter_link = "ib-hdr";
            d.topology = "rail-optimized", d.host_w_per_node = 6500 - 8 * 400;
            d.source = "NVIDIA A100 datasheet; DGX A100 user guide";
        }
        t["A100-40GB"].mem_bytes = 40 * kGiB, t["A100-40GB"].mem_bw = 1555 * kG;
        t["A100-80GB"].mem_bytes = 80 * kGiB, t["A100-80GB"].mem_bw = 2039 * kG;
        // AWS p4d.24xlarge / p4de.24xlarge on demand, us-east-1, per GPU
        // ($32.77 and $40.97 per 8-GPU hour); spot at the ~60% discount
        // typical of those instance families. Override with cluster.price_*.
        t["A100-40GB"].price_hour = 4.10, t["A100-40GB"].spot_price_hour = 1.64;
        t["A100-80GB"].price_hour = 5.12, t["A100-80GB"].spot_price_hour = 2.05;
    }
    {
        // NVIDIA H100 datasheet (2023): SXM 67 TF fp32, 494.7 TF tf32, 989.4 TF
        // bf16/fp16, 1,978.9 TF fp8 dense; 80 GB HBM3 3.35 TB/s; 700 W; NVLink 4
        // 900 GB/s bidirectional. PCIe: 51 / 378 / 756 / 1,513 TF, 80 GB HBM2e
        // 2.0 TB/s, 350 W, PCIe Gen5 128 GB/s bidirectional.
        Device& s = nvidia("H100-SXM");
        s.peak_fp32 = 67 * kT, s.peak_tf32 = 494.7 * kT, s.peak_bf16 = 989.4 * kT;
        s.peak_fp16 = 989.4 * kT, s.peak_fp8 = 1978.9 * kT;
        s.mem_bytes = 80 * kGiB, s.mem_bw = 3350 * kG, s.tdp_w = 700;
        s.intra_link = "nvlink4", s.inter_link = "ib-ndr", s.topology = "rail-optimized";
        s.host_w_per_node = 10200 - 8 * 700;  // DGX H100: 10.2 kW max
        s.gemm_eff = 0.65, s.fp8_eff = 1.03;  // fitted: tests/plan/validation.toml
        // AWS p5.48xlarge on demand (2024, $98.32 per 8-GPU hour), per GPU.
        s.price_hour = 12.29, s.spot_price_hour = 4.92;
        s.source = "NVIDIA H100 datasheet; DGX H100 user guide";
        Device& p = nvidia("H100-PCIe");
        p.peak_fp32 = 51 * kT, p.peak_tf32 = 378 * kT, p.peak_bf16 = 756 * kT;
        p.peak_fp16 = 756 * kT, p.peak_fp8 = 1513 * kT;
        p.mem_bytes = 80 * kGiB, p.mem_bw = 2000 * kG, p.tdp_w = 350;
        p.intra_link = "pcie5", p.inter_link = "roce-200", p.topology = "fat-tree";
        p.host_w_per_node = 2000, p.gemm_eff = 0.65;
        p.price_hour = 4.50, p.spot_price_hour = 1.80;
        p.source = "NVIDIA H100 datasheet (PCIe)";
        // NVIDIA H200 datasheet (2024): H100 SXM compute, 141 GB HBM3e at
        // 4.8 TB/s, up to 700 W.
        Device& h = nvidia("H200");
        h = s;
        h.name = "H200", h.mem_bytes = 141e9, h.mem_bw = 4800 * kG;
        h.price_hour = 10.60, h.spot_price_hour = 4.24;
        h.source = "NVIDIA H200 datasheet";
        // NVIDIA HGX B200 datasheet (2024): per GPU 2.25 PF bf16 and 4.5 PF
        // fp8 dense (half the sparse figures), 180 GB HBM3e usable at 8 TB/s,
        // NVLink 5 1.8 TB/s bidirectional, 1,000 W; DGX B200 14.3 kW max.
        Device& b = nvidia("B200");
        b.peak_fp32 = 75 * kT, b.peak_tf32 = 1100 * kT, b.peak_bf16 = 2250 * kT;
        b.peak_fp16 = 2250 * kT, b.peak_fp8 = 4500 * kT;
        b.mem_bytes = 180e9, b.mem_bw = 8000 * kG, b.tdp_w = 1000;
        b.intra_link = "nvlink5", b.inter_link = "ib-xdr", b.topology = "rail-optimized";
        b.host_w_per_node = 14300 - 8 * 1000, b.gemm_eff = 0.61, b.fp8_eff = 1.0;
        b.price_hour = 14.00, b.spot_price_hour = 5.60;
        b.source = "NVIDIA HGX B200 datasheet; DGX B200 user guide";
    }
    {
        // NVIDIA Tesla V100 datasheet (2018): SXM2/SXM3 15.7 TF fp32, 125 TF
        // fp16 tensor (no bf16: it falls back to fp32), 32 GB HBM2 at 900 GB/s,
        // 300 W; NVLink 2: 300 GB/s bidirectional. DGX-2 datasheet: 16 GPUs on
        // NVSwitch, 8 x 100 Gb/s InfiniBand EDR, 10 kW. (DGX-2H runs 450 W
        // parts at 130 TF fp16: set cluster.peak_tflops = 130.)
        Device& d = nvidia("V100-32GB");
        d.peak_fp32 = 15.7 * kT, d.peak_tf32 = 15.7 * kT, d.peak_fp16 = 125 * kT;
        d.mem_bytes = 32 * kGiB, d.mem_bw = 900 * kG, d.tdp_w = 300;
        d.devices_per_node = 16, d.intra_link = "nvswitch-v100", d.inter_link = "ib-edr-half";
        d.topology = "fat-tree", d.host_w_per_node = 10000 - 16 * 300;
        d.reserved_bytes = 1.0 * kGiB, d.gemm_eff = 0.87;  // fitted: validation.toml
        d.price_hour = 3.06, d.spot_price_hour = 0.92;     // AWS p3dn.24xlarge, per GPU
        d.source = "NVIDIA V100 datasheet; DGX-2 datasheet";
    }
    {
        // NVIDIA H800 SXM: the H100 SXM die and memory (989.4 TF bf16, 1,978.9
        // TF fp8 dense, 80 GB HBM3 at 3.35 TB/s, 700 W) with NVLink cut to 400
        // GB/s bidirectional; DeepSeek-V3 technical report (2024), Section 3.1:
        // 8 GPUs per node on NVLink, 8 x 400 Gb/s InfiniBand per node.
        Device& h = nvidia("H800");
        h = t["H100-SXM"];
        h.name = "H800", h.intra_link = "nvlink4-h800";
        h.price_hour = 2.00, h.spot_price_hour = 2.00;  // DeepSeek-V3's rental assumption
        h.source = "NVIDIA H800 product brief; DeepSeek-V3 technical report, Section 3.1";
    }
    {
        // AMD Instinct MI250X datasheet (2021): per module 383 TF bf16/fp16,
        // 95.7 TF fp32 matrix, 128 GB HBM2e at 3.2 TB/s, 560 W, two graphics
        // compute dies (GCDs) that software sees as two GPUs. One device here
        // is one GCD (half of each figure), as Frontier's users count them.
        // Frontier (OLCF user guide): 4 MI250X (8 GCDs) per node, GCDs joined
        // by Infinity Fabric at 50-200 GB/s, 4 Slingshot-11 NICs of 25 GB/s
        // per node (one per module), dragonfly network.
        Device& d = t["MI250X"];
        d.name = "MI250X", d.kind = "gpu";
        d.peak_fp32 = 47.9 * kT, d.peak_tf32 = 47.9 * kT, d.peak_bf16 = 191.5 * kT;
        d.peak_fp16 = 191.5 * kT;
        d.mem_bytes = 64 * kGiB, d.mem_bw = 1600 * kG, d.tdp_w = 280;
        d.gemm_eff = 0.45, d.gemm_knee = 64, d.mem_eff = 0.7;
        d.devices_per_node = 8, d.intra_link = "xgmi-mi250x", d.inter_link = "slingshot-half";
        d.topology = "dragonfly+", d.host_w_per_node = 800, d.reserved_bytes = 2.0 * kGiB;
        d.price_hour = 1.50, d.spot_price_hour = 0.60;
        d.source = "AMD Instinct MI250X datasheet; OLCF Frontier user guide";
    }
    {
        // Intel Gaudi 2 (HL-225H) datasheet / white paper (2022): 432 TF bf16
        // (matrix engines), 865 TF fp8, 96 GB HBM2e at 2.46 TB/s, 600 W; 24
        // on-chip 100 GbE RoCE ports: 21 join the 8 cards of a node all-to-all,
        // 3 per card go out of the node.
        Device& d = t["Gaudi2"];
        d.name = "Gaudi2", d.kind = "gpu";
        d.peak_fp32 = 432 * kT / 4, d.peak_tf32 = 432 * kT / 2, d.peak_bf16 = 432 * kT;
        d.peak_fp16 = 432 * kT, d.peak_fp8 = 865 * kT;
        d.mem_bytes = 96e9, d.mem_bw = 2460 * kG, d.tdp_w = 600;
        d.gemm_eff = 0.90, d.gemm_knee = 128, d.mem_eff = 0.7;  // fitted: validation.toml
        d.devices_per_node = 8, d.intra_link = "roce-gaudi2-21x100", d.inter_link = "roce-300";
        d.topology = "fat-tree", d.host_w_per_node = 3000, d.reserved_bytes = 2.0 * kGiB;
        d.price_hour = 1.30, d.spot_price_hour = 0.65;
        d.source = "Intel Gaudi 2 datasheet and white paper (2022)";
    }
    {
        // AMD Instinct MI300X datasheet (2023): 163.4 TF fp32 (matrix),
        // 653.7 TF tf32, 1,307.4 TF bf16/fp16, 2,614.9 TF fp8 dense; 192 GB HBM3
        // at 5.3 TB/s; 750 W; 7 Infinity Fabric links of 64 GB/s per direction.
        Device& d = t["MI300X"];
        d.name = "MI300X", d.kind = "gpu";
        d.peak_fp32 = 163.4 * kT, d.peak_tf32 = 653.7 * kT, d.peak_bf16 = 1307.4 * kT;
        d.peak_fp16 = 1307.4 * kT, d.peak_fp8 = 2614.9 * kT;
        d.mem_bytes = 192e9, d.mem_bw = 5300 * kG, d.tdp_w = 750;
        d.gemm_eff = 0.45, d.gemm_knee = 64, d.mem_eff = 0.7;
        d.devices_per_node = 8, d.intra_link = "xgmi", d.inter_link = "roce-400";
        d.topology = "rail-optimized", d.host_w_per_node = 3000;
        d.reserved_bytes = 2.0 * kGiB;
        d.price_hour = 6.00, d.spot_price_hour = 2.40;
        d.source = "AMD Instinct MI300X datasheet";
    }
    {
        // Jouppi et al. 2023, "TPU v4" (ISCA): 275 TF bf16, 32 GiB HBM2 at
        // 1,200 GB/s, 6 ICI links, 4,096 chips per pod in a 3D torus; mean
        // power ~170 W, 192 W max. Google Cloud TPU v5p docs: 459 TF bf16,
        // 95 GB HBM2e at 2,765 GB/s, 4,800 Gb/s ICI per chip, 8,960 chips per pod
        // (power unpublished: 450 W is an estimate). Prices: Cloud TPU list.
        Device& v4 = t["TPUv4"];
        v4.name = "TPUv4", v4.kind = "tpu";
        v4.peak_fp32 = 275 * kT / 4, v4.peak_bf16 = 275 * kT, v4.peak_fp16 = 275 * kT;
        v4.mem_bytes = 32 * kGiB, v4.mem_bw = 1200 * kG, v4.tdp_w = 192;
        v4.gemm_eff = 0.65, v4.gemm_knee = 128, v4.mem_eff = 0.8;
        v4.devices_per_node = 4096, v4.intra_link = "ici-v4", v4.inter_link = "dcn";
        v4.topology = "dcn", v4.host_w_per_node = 0, v4.reserved_bytes = 0.5 * kGiB;
        v4.price_hour = 3.22, v4.spot_price_hour = 1.45;
        v4.source = "Jouppi et al. 2023 (TPU v4, ISCA); Cloud TPU pricing";
        // TPU v3 (Jouppi et al. 2020, "A domain-specific supercomputer for
        // training deep neural networks", CACM): 123 TF bf16 per chip (two
        // cores), 32 GiB HBM at 900 GB/s, 1,024 chips per pod in a 2D torus,
        // 4 ICI links of 656 Gb/s; ~450 W per chip (an estimate).
        Device& v3 = t["TPUv3"];
        v3 = v4;
        v3.name = "TPUv3", v3.peak_fp32 = 123 * kT / 4, v3.peak_bf16 = 123 * kT;
        v3.peak_fp16 = 123 * kT, v3.mem_bytes = 32 * kGiB, v3.mem_bw = 900 * kG;
        v3.tdp_w = 450, v3.devices_per_node = 1024, v3.intra_link = "ici-v3";
        v3.price_hour = 2.00, v3.spot_price_hour = 0.60;
        v3.source = "Jouppi et al. 2020 (TPU v3, CACM); Cloud TPU pricing";
        Device& v5 = t["TPUv5p"];
        v5 = v4;
        v5.name = "TPUv5p", v5.peak_fp32 = 459 * kT / 4, v5.peak_bf16 = 459 * kT;
        v5.peak_fp16 = 459 * kT, v5.peak_fp8 = 918 * kT;
        v5.mem_bytes = 95e9, v5.mem_bw = 2765 * kG, v5.tdp_w = 450;
        v5.devices_per_node = 8960, v5.intra_link = "ici-v5p";
        v5.price_hour = 4.20, v5.spot_price_hour = 2.10;
        v5.source = "Google Cloud TPU v5p documentation and pricing";
    }
    {
        // This machine: 2 cores of an AMD EPYC family 26 (Zen 5) with full-width
        // AVX-512: 2 FMA pipes x 16 fp32 lanes x 2 = 64 fp32 FLOP/cycle/core; at
        // ~3.0 GHz all-core: 384 GFLOP/s fp32, and AVX512_BF16 dot products
        // double it to 768. Measured: oneDNN sgemm ~380 GFLOP/s, bf16 matmul
        // ~700 GFLOP/s with 2 threads (apiary lead's measurement, 2026). Memory:
        // a single-thread 200 MiB memcpy moves 27-29 GB/s (read + write) on
        // this shared VM, so 30 GB/s for both cores; calibrate refines it.
        // Power: a 2-core share of a ~300 W 64-core part, ~10 W per core.
        Device& c = t["epyc-zen5-2c"];
        c.name = "epyc-zen5-2c", c.kind = "cpu";
        c.peak_fp32 = 384 * kG, c.peak_tf32 = 384 * kG, c.peak_bf16 = 768 * kG;
        c.peak_fp16 = 384 * kG;
        c.mem_bytes = 24 * kGiB, c.mem_bw = 30 * kG, c.tdp_w = 2 * 10;
        c.gemm_eff = 0.6, c.gemm_knee = 32, c.mem_eff = 0.8;
        c.devices_per_node = 64, c.intra_link = "shm", c.inter_link = "eth-25g";
        c.topology = "fat-tree", c.host_w_per_node = 30, c.reserved_bytes = 0.2 * kGiB;
        c.price_hour = 0.08, c.spot_price_hour = 0.03, c.shared_by_ranks = true;
        c.cores = 2, c.dp_overlap = 0;
        c.source = "measured on this machine (2 vCPU AMD EPYC Zen 5)";
    }
    return t;
}

std::map<std::string, Link> make_links() {
    std::map<std::string, Link> t;
    auto add = [&](const char* name, double gbs, double lat_us, double eff, const char* src) {
        t[name] = Link{name, gbs * kG, lat_us * kUs, eff, src};
    };
    // NCCL sustains ~80% of NVLink bandwidth in all-reduce bus bandwidth
    // (nccl-tests on DGX A100: ~230 of 300 GB/s).
    add("nvlink3", 300, 3, 0.77, "A100 datasheet: 12 links x 25 GB/s per direction");
    add("nvlink4", 450, 3, 0.8, "H100 datasheet: 18 links x 25 GB/s per direction");
    add("nvlink5", 900, 3, 0.8, "B200 datasheet: 1.8 TB/s bidirectional");
    add("nvlink4-h800", 200, 3, 0.8, "H800: NVLink 400 GB/s bidirectional");
    add("nvswitch-v100", 150, 4, 0.8, "V100 NVLink 2 through DGX-2 NVSwitch: 6 x 25 GB/s");
    add("xgmi-mi250x", 50, 5, 0.7, "MI250X Infinity Fabric between modules: 50 GB/s per link");
    add("roce-gaudi2-21x100", 262.5, 5, 0.8, "Gaudi 2: 21 x 100 GbE inside the node");
    add("roce-300", 37.5, 8, 0.85, "Gaudi 2: 3 x 100 GbE per card out of the node");
    add("ib-edr-half", 6.25, 5, 0.9, "DGX-2: 8 x InfiniBand EDR 100 Gb/s for 16 GPUs");
    add("slingshot-half", 12.5, 5, 0.85, "Frontier: Slingshot-11 25 GB/s per MI250X (2 GCDs)");
    add("ici-v3", 160, 2, 0.8, "TPU v3 ICI: 4 links x 656 Gb/s (2D torus)");
    add("xgmi", 448, 4, 0.7, "MI300X datasheet: 7 x 64 GB/s Infinity Fabric");
    add("pcie4", 32, 5, 0.8, "PCIe 4.0 x16: 32 GB/s per direction");
    add("pcie5", 64, 5, 0.8, "PCIe 5.0 x16: 64 GB/s per direction");
    add("ib-hdr", 25, 5, 0.9, "InfiniBand HDR: 200 Gb/s per port");
    add("ib-ndr", 50, 5, 0.9, "InfiniBand NDR: 400 Gb/s per port");
    add("ib-xdr", 100, 5, 0.9, "InfiniBand XDR: 800 Gb/s per port");
    add("roce-100", 12.5, 8, 0.85, "RoCE v2 100 GbE");
    add("roce-200", 25, 8, 0.85, "RoCE v2 200 GbE");
    add("roce-400", 50, 8, 0.85, "RoCE v2 400 GbE");
    add("eth-25g", 3.125, 20, 0.8, "25 GbE TCP");
    // Jean Zay (BLOOM): 4 Omni-Path 100 Gb/s links per 8-GPU node.
    add("opa-100-half", 6.25, 5, 0.9, "Omni-Path 100 Gb/s, one port per two GPUs");
    add("ici-v4", 270, 2, 0.8, "TPU v4 ICI: 6 links x ~45 GB/s (Jouppi et al. 2023)");
    add("ici-v5p", 600, 2, 0.8, "TPU v5p ICI: 4,800 Gb/s per chip (Cloud TPU docs)");
    add("dcn", 6.25, 20, 0.8, "TPU data-center network: 200 Gb/s per host of 4 chips");
    // MPI over shared memory between ranks of one host: a copy through a
    // shared segment, bounded by memory bandwidth; calibrate replaces it.
    add("shm", 8, 1, 0.8, "estimate for this machine's DDR5; apiary plan calibrate");
    return t;
}

std::map<std::string, Topology> make_topologies() {
    std::map<std::string, Topology> t;
    // Three-tier non-blocking folded Clos (Leiserson 1985; NVIDIA DGX
    // SuperPOD reference architecture uses 32-node scalable units).
    t["fat-tree"] = {
        "fat-tree",
        {{"leaf", 256, 1.0, 1 * kUs}, {"spine", 4096, 1.0, 2 * kUs}, {"core", 0, 1.0, 3 * kUs}},
        "non-blocking three-tier Clos"};
    t["fat-tree-2to1"] = {
        "fat-tree-2to1",
        {{"leaf", 256, 1.0, 1 * kUs}, {"spine", 4096, 0.5, 2 * kUs}, {"core", 0, 0.5, 3 * kUs}},
        "Clos with 2:1 oversubscription above the leaf"};
    // Rail-optimized (DGX SuperPOD): GPU i of every node shares a rail
    // switch, so same-rank traffic crosses one hop inside a 32-node unit.
    t["rail-optimized"] = {"rail-optimized",
                           {{"rail", 256, 1.0, 0.7 * kUs},
                            {"spine", 16384, 1.0, 1.5 * kUs},
                            {"core", 0, 1.0, 2.5 * kUs}},
                           "NVIDIA DGX SuperPOD reference architecture"};
    // Dragonfly+ (Shpiner et al. 2017): full bandwidth inside a group, global
    // links tapered (here 2:1) with an extra hop.
    t["dragonfly+"] = {"dragonfly+",
                       {{"group", 1024, 1.0, 1 * kUs}, {"global", 0, 0.5, 3 * kUs}},
                       "Shpiner et al. 2017, Dragonfly+"};
    // TPU pods: ICI inside the pod (the "node" tier), data-center network
    // between pods.
    t["dcn"] = {"dcn", {{"dcn", 0, 1.0, 10 * kUs}}, "Cloud TPU multislice over DCN"};
    return t;
}

const std::map<std::string, Device>& devices() {
    static const auto t = make_devices();
    return t;
}
const std::map<std::string, Link>& links() {
    static const auto t = make_links();
    return t;
}
const std::map<std::string, Topology>& topologies() {
    static const auto t = make_topologies();
    return t;
}

template <class Map>
std::vector<std::string> names_of(const Map& m) {
    std::vector<std::string> v;
    for (const auto& [k, _] : m) v.push_back(k);
    return v;
}

template <class Map>
const typename Map::mapped_type& lookup(const Map& m, const std::string& name, const char* what,
                                        const char* key) {
    auto it = m.find(name);
    if (it == m.end()) {
        throw ConfigError(fmt::format("{}: unknown {} '{}' (known: {})", key, what, name,
                                      fmt::join(names_of(m), ", ")));
    }
    return it->second;
}

}  // namespace

const char* dtype_name(Dtype d) {
    switch (d) {
        case Dtype::fp32:
            return "fp32";
        case Dtype::tf32:
            return "tf32";
        case Dtype::bf16:
            return "bf16";
        case Dtype::fp16:
            return "fp16";
        case Dtype::fp8:
            return "fp8";
    }
    return "?";
}

Dtype parse_dtype(const std::string& name) {
    for (Dtype d : {Dtype::fp32, Dtype::tf32, Dtype::bf16, Dtype::fp16, Dtype::fp8}) {
        if (name == dtype_name(d)) return d;
    }
    throw ConfigError(fmt::format(
        "train.precision: unknown precision '{}' (known: fp32, tf32, bf16, fp16, fp8)", name));
}

double Device::peak(Dtype d) const {
    switch (d) {
        case Dtype::fp8:
            return peak_fp8 > 0 ? peak_fp8 : peak(Dtype::bf16);
        case Dtype::fp16:
            return peak_fp16 > 0 ? peak_fp16 : peak(Dtype::bf16);
        case Dtype::bf16:
            return peak_bf16 > 0 ? peak_bf16 : peak(Dtype::fp32);
        case Dtype::tf32:
            return peak_tf32 > 0 ? peak_tf32 : peak(Dtype::fp32);
        case Dtype::fp32:
            return peak_fp32;
    }
    return peak_fp32;
}

const Device* find_device(const std::string& name) {
    auto it = devices().find(name);
    return it == devices().end() ? nullptr : &it->second;
}
const Device& device(const std::string& name) {
    return lookup(devices(), name, "device", "cluster.device");
}
std::vector<std::string> device_names() { return names_of(devices()); }
const Link& link(const std::string& name) {
    return lookup(links(), name, "link", "cluster.inter_link");
}
std::vector<std::string> link_names() { return names_of(links()); }
const Topology& topology(const std::string& name) {
    return lookup(topologies(), name, "topology", "cluster.topology");
}
std::vector<std::string> topology_names() { return names_of(topologies()); }

GpuSpec parse_gpus(const std::string& text) {
    GpuSpec g;
    const auto x = text.find('x');
    if (x != std::string::npos && x > 0) {
        long long n = 0;
        const auto* end = text.data() + x;
        auto [p, ec] = std::from_chars(text.data(), end, n);
        if (ec == std::errc() && p == end) {
            if (n < 1) throw ConfigError(fmt::format("--gpus '{}': count must be >= 1", text));
            g.count = n;
            g.device = text.substr(x + 1);
            device(g.device);  // validates, listing the known ones
            return g;
        }
    }
    long long n = 0;
    auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
    if (ec == std::errc() && p == text.data() + text.size()) {
        if (n < 1) throw ConfigError(fmt::format("--gpus '{}': count must be >= 1", text));
        g.count = n;
        return g;
    }
    g.device = text;
    device(g.device);
    return g;
}

}  // namespace apiary::plan
