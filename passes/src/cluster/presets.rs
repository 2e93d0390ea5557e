//! Built-in GPU types and cluster presets. Every figure names its source.
//!
//! Throughputs are *dense* peaks (NVIDIA's datasheets print tensor-core figures "with
//! sparsity", twice the dense ones; ralpc uses the dense half). Link bandwidths are per
//! direction: NVIDIA quotes NVLink as the sum of both directions.
//!
//! Latencies α are NCCL's own per-step figures for its ring algorithm with the Simple
//! protocol (the one used for large messages), from its tuning model
//! (`src/graph/tuning.cc`, `hwLat`): NVLink 3.4 µs, PCIe 5.7 µs, network 9.6 µs.

use super::{Cluster, Generation, GpuType, Host, Link, NodeGroup};

const TERA: f64 = 1e12;
const GB: f64 = 1e9;
const GIB: u64 = 1 << 30;

/// NCCL ring/Simple step latency over NVLink (tuning.cc `hwLat`), µs.
const NVLINK_LATENCY_US: f64 = 3.4;
/// NCCL ring/Simple step latency over PCIe (tuning.cc `hwLat`), µs.
const PCIE_LATENCY_US: f64 = 5.7;
/// NCCL ring/Simple step latency over the network (tuning.cc `hwLat`), µs.
const NET_LATENCY_US: f64 = 9.6;

/// Names of the built-in GPU types.
pub const GPU_TYPES: &[&str] = &[
    "a100-sxm4-80gb",
    "a100-pcie-80gb",
    "b200",
    "gb200",
    "gb300",
    "h100-sxm5-80gb",
    "h200-sxm-141gb",
    "mi300x",
    "v100-sxm2-32gb",
];

/// A built-in GPU type by name.
pub fn gpu_type(name: &str) -> Option<GpuType> {
    let gpu = |memory_gb: u64,
               hbm_tb_s: f64,
               fp32: f64,
               tf32: Option<f64>,
               fp16: Option<f64>,
               fp8: Option<f64>,
               generation: Generation| GpuType {
        name: name.into(),
        memory_bytes: memory_gb * GIB,
        hbm_bandwidth: hbm_tb_s * 1000.0 * GB,
        fp32: fp32 * TERA,
        tf32: tf32.map(|f| f * TERA),
        fp16: fp16.map(|f| f * TERA),
        bf16: fp16.map(|f| f * TERA),
        fp8: fp8.map(|f| f * TERA),
        generation,
    };
    Some(match name {
        // NVIDIA A100 Tensor Core GPU datasheet (2021), SXM column: FP32 19.5 TFLOPS,
        // TF32 156, BF16/FP16 312 (dense), 80 GB HBM2e at 2,039 GB/s; no FP8.
        "a100-sxm4-80gb" => gpu(
            80,
            2.039,
            19.5,
            Some(156.0),
            Some(312.0),
            None,
            Generation::Ampere,
        ),
        // Same datasheet, PCIe column: the same peaks, 80 GB HBM2e at 1,935 GB/s.
        "a100-pcie-80gb" => gpu(
            80,
            1.935,
            19.5,
            Some(156.0),
            Some(312.0),
            None,
            Generation::Ampere,
        ),
        // NVIDIA H100 Tensor Core GPU datasheet, SXM column: FP32 67 TFLOPS, TF32 989 /
        // BF16 and FP16 1,979 / FP8 3,958 "with sparsity" (dense: half), 80 GB HBM3 at
        // 3.35 TB/s.
        "h100-sxm5-80gb" => gpu(
            80,
            3.35,
            67.0,
            Some(494.5),
            Some(989.5),
            Some(1979.0),
            Generation::Hopper,
        ),
        // NVIDIA H200 Tensor Core GPU datasheet, SXM column: the H100's tensor cores
        // (TF32 989, BF16 1,979, FP8 3,958 TFLOPS with sparsity; FP32 67) with 141 GB of
        // HBM3e at 4.8 TB/s.
        "h200-sxm-141gb" => gpu(
            141,
            4.8,
            67.0,
            Some(494.5),
            Some(989.5),
            Some(1979.0),
            Generation::Hopper,
        ),
        // NVIDIA HGX B200 specifications (8 GPUs, "with sparsity"): FP8 72 PFLOPS, BF16 36,
        // TF32 18; FP32 600 TFLOPS; 1.4 TB of HBM3e at 64 TB/s. Per GPU, dense: FP8 4.5,
        // BF16 2.25, TF32 1.125 PFLOPS, FP32 75 TFLOPS, 180 GB at 8 TB/s.
        "b200" => gpu(
            180,
            8.0,
            75.0,
            Some(1125.0),
            Some(2250.0),
            Some(4500.0),
            Generation::Blackwell,
        ),
        // NVIDIA GB200 NVL72 specifications (72 GPUs, "with sparsity"): FP8 720 PFLOPS,
        // BF16 360, TF32 180; FP32 5,760 TFLOPS; 13.4 TB of HBM3e at 576 TB/s. Per GPU,
        // dense: FP8 5, BF16 2.5, TF32 1.25 PFLOPS, FP32 80 TFLOPS, 186 GB at 8 TB/s.
        "gb200" => gpu(
            186,
            8.0,
            80.0,
            Some(1250.0),
            Some(2500.0),
            Some(5000.0),
            Generation::Blackwell,
        ),
        // NVIDIA GB300 NVL72 specifications (72 Blackwell Ultra GPUs, "with sparsity"):
        // FP8 720 PFLOPS, BF16 360, TF32 180; FP32 5,760 TFLOPS; up to 20 TB of HBM3e at
        // 576 TB/s. Per GPU, dense: as the GB200's, with 288 GB at 8 TB/s.
        "gb300" => gpu(
            288,
            8.0,
            80.0,
            Some(1250.0),
            Some(2500.0),
            Some(5000.0),
            Generation::Blackwell,
        ),
        // AMD Instinct MI300X data sheet: FP32 matrix 163.4 TFLOPS, TF32 653.7, BF16 and
        // FP16 1,307.4, FP8 2,614.9 (dense), 192 GB HBM3 at 5.3 TB/s.
        "mi300x" => gpu(
            192,
            5.3,
            163.4,
            Some(653.7),
            Some(1307.4),
            Some(2614.9),
            Generation::Cdna3,
        ),
        // NVIDIA V100 Tensor Core GPU datasheet, SXM2 column: FP32 15.7 TFLOPS, tensor
        // (FP16) 125 TFLOPS, 32 GB HBM2 at 900 GB/s; Volta has no TF32, BF16 or FP8.
        "v100-sxm2-32gb" => GpuType {
            bf16: None,
            ..gpu(32, 0.9, 15.7, None, Some(125.0), None, Generation::Volta)
        },
        _ => return None,
    })
}

/// Names of the built-in clusters (one node each; `NAMExN` for N nodes).
pub const PRESETS: &[&str] = &[
    "dgx-a100",
    "dgx-h100",
    "dgx-h200",
    "dgx-b200",
    "gb200-nvl72",
    "gb300-nvl72",
    "mi300x",
    "p3dn-v100",
    "pcie-a100",
    "selene",
    "eos",
];

fn server(gpu: &str, intra_node: Link, network: Link) -> NodeGroup {
    NodeGroup {
        gpu: gpu_type(gpu).expect("built-in GPU type"),
        nodes: 1,
        gpus_per_node: 8,
        intra_node,
        network,
        host: None,
    }
}

/// A PCIe x16 link of one generation, per direction: 16 lanes at `gt_s` GT/s with 128b/130b
/// encoding (PCI-SIG: Gen3 8 GT/s, 15.75 GB/s; Gen4 16 GT/s, 31.5 GB/s; Gen5 32 GT/s,
/// 63.0 GB/s).
fn pcie_x16(gt_s: f64) -> Link {
    Link {
        latency_us: PCIE_LATENCY_US,
        bandwidth: gt_s * 16.0 * 128.0 / 130.0 / 8.0 * GB,
    }
}

/// The host of an 8-GPU server: two CPU sockets, each with `channels` DDR channels at
/// `mt_s` MT/s (8 bytes a transfer), `memory` bytes in all.
fn two_sockets(link: Link, memory: u64, channels: f64, mt_s: f64) -> Host {
    Host {
        gpus: 8,
        link,
        memory_bytes: memory,
        memory_bandwidth: 2.0 * channels * mt_s * 1e6 * 8.0,
    }
}

/// One Grace CPU of a Grace Blackwell NVL72 rack (36 of them), joined to its two GPUs by
/// NVLink-C2C at 900 GB/s in both directions (NVIDIA GB200 NVL72 specifications): 450 GB/s
/// each way, 225 GB/s for each GPU when both copy; the rack's LPDDR5X memory and bandwidth
/// over its 36 CPUs.
fn grace(rack_memory: u64, rack_bandwidth: f64) -> Host {
    Host {
        gpus: 2,
        link: Link {
            latency_us: NVLINK_LATENCY_US,
            bandwidth: 225.0 * GB,
        },
        memory_bytes: rack_memory / 36,
        memory_bandwidth: rack_bandwidth / 36.0,
    }
}

/// NVLink 5 (Blackwell): 1.8 TB/s per GPU, both directions (NVIDIA HGX B200 and GB200
/// NVL72 specifications): 900 GB/s each way.
const NVLINK5: Link = Link {
    latency_us: NVLINK_LATENCY_US,
    bandwidth: 900.0 * GB,
};

/// One NIC per GPU at `gbit_s` gigabits per second, for `gpus` GPUs.
fn nics(gpus: u32, gbit_s: f64) -> Link {
    Link {
        latency_us: NET_LATENCY_US,
        bandwidth: f64::from(gpus) * gbit_s / 8.0 * GB,
    }
}

/// A rack-scale NVLink domain: `gpus` GPUs on one NVLink switch fabric (18 compute trays
/// of 4 in an NVL72), each GPU with its own NIC. ralpc's node is the NVLink domain: tensor,
/// context and expert groups may span trays inside it, never cross it.
fn nvlink_domain(gpu: &str, gpus: u32, nic_gbit_s: f64) -> NodeGroup {
    NodeGroup {
        gpus_per_node: gpus,
        ..server(gpu, NVLINK5, nics(gpus, nic_gbit_s))
    }
}

/// One node of a built-in cluster.
pub(super) fn preset_node(name: &str) -> Option<NodeGroup> {
    Some(match name {
        // NVIDIA DGX A100 user guide: 8 A100-SXM4-80GB on NVSwitch, 600 GB/s of NVLink per
        // GPU (both directions: 300 GB/s each way); 8 single-port ConnectX-6 HDR InfiniBand
        // at 200 Gb/s (25 GB/s) each, 200 GB/s per node. Host (DGX A100 640GB datasheet):
        // 2 TB of memory on two AMD EPYC 7742, 8 channels of DDR4-3200 each; the GPUs on
        // PCIe Gen4 x16, two on each of four PCIe switches with one x16 link up to a CPU
        // (the user guide's system topology), so half of it each when all copy.
        "dgx-a100" => NodeGroup {
            host: Some(two_sockets(
                Link {
                    bandwidth: pcie_x16(16.0).bandwidth / 2.0,
                    ..pcie_x16(16.0)
                },
                2 << 40,
                8.0,
                3200.0,
            )),
            ..server(
                "a100-sxm4-80gb",
                Link {
                    latency_us: NVLINK_LATENCY_US,
                    bandwidth: 300.0 * GB,
                },
                Link {
                    latency_us: NET_LATENCY_US,
                    bandwidth: 8.0 * 25.0 * GB,
                },
            )
        },
        // Selene, where Megatron-LM's published runs were measured (Narayanan et al., SC'21,
        // §5): DGX A100 80 GB nodes (as above), the 8 compute HDR InfiniBand ports of each on
        // a full fat tree (NVIDIA DGX SuperPOD reference architecture: no oversubscription,
        // so no rack level).
        "selene" => preset_node("dgx-a100")?,
        // Eos, the DGX H100 SuperPOD: DGX H100 nodes (as below), 8 × 400 Gb/s NDR
        // InfiniBand each on a full fat tree (NVIDIA DGX SuperPOD DGX H100 reference
        // architecture).
        "eos" => preset_node("dgx-h100")?,
        // NVIDIA DGX H100 user guide: 8 H100-SXM5-80GB, fourth-generation NVLink at 900 GB/s
        // per GPU (450 GB/s each way); 8 ConnectX-7 NDR InfiniBand at 400 Gb/s (50 GB/s)
        // each, 400 GB/s per node. Host (DGX H100 datasheet): 2 TB of memory on two Intel
        // Xeon Platinum 8480C, 8 channels each, two DIMMs a channel, which Sapphire Rapids
        // runs at DDR5-4400 (4800 with one); each GPU on PCIe Gen5 x16 (how the PCIe
        // switches share their links up to the CPUs is not published: not modeled).
        "dgx-h100" => NodeGroup {
            host: Some(two_sockets(pcie_x16(32.0), 2 << 40, 8.0, 4400.0)),
            ..server(
                "h100-sxm5-80gb",
                Link {
                    latency_us: NVLINK_LATENCY_US,
                    bandwidth: 450.0 * GB,
                },
                Link {
                    latency_us: NET_LATENCY_US,
                    bandwidth: 8.0 * 50.0 * GB,
                },
            )
        },
        // NVIDIA DGX H200 user guide: 8 H200 on the DGX H100's NVLink 4 switches (900 GB/s
        // per GPU, 450 each way) and 8 ConnectX-7 at 400 Gb/s; its host (2 TB, two Xeon
        // Platinum 8480C, PCIe Gen5).
        "dgx-h200" => NodeGroup {
            gpu: gpu_type("h200-sxm-141gb")?,
            ..preset_node("dgx-h100")?
        },
        // NVIDIA DGX B200 user guide: 8 B200 on NVLink 5 (1.8 TB/s per GPU), 8 single-port
        // ConnectX-7 at 400 Gb/s for the compute fabric. Host (DGX B200 datasheet): 2 TB of
        // memory (4 TB optional) on two Intel Xeon Platinum 8570, 8 channels each, two
        // DIMMs a channel at DDR5-4400 (5600 with one); each GPU on PCIe Gen5 x16 (shared
        // links up to the CPUs not modeled).
        "dgx-b200" => NodeGroup {
            host: Some(two_sockets(pcie_x16(32.0), 2 << 40, 8.0, 4400.0)),
            ..server("b200", NVLINK5, nics(8, 400.0))
        },
        // NVIDIA GB200 NVL72: 72 GB200 GPUs in one NVLink domain (130 TB/s, 1.8 TB/s per
        // GPU), 4 per compute tray, each tray with 4 ConnectX-7 at 400 Gb/s (one per GPU).
        // Host: 17 TB of LPDDR5X at up to 18.4 TB/s (36 Grace CPUs of 480 GB).
        "gb200-nvl72" => NodeGroup {
            host: Some(grace(36 * 480_000_000_000, 18.4e12)),
            ..nvlink_domain("gb200", 72, 400.0)
        },
        // NVIDIA GB300 NVL72: 72 Blackwell Ultra GPUs in one NVLink domain, each with a
        // ConnectX-8 SuperNIC at 800 Gb/s. Host: 17 TB of LPDDR5X at up to 14 TB/s.
        "gb300-nvl72" => NodeGroup {
            host: Some(grace(17_000_000_000_000, 14e12)),
            ..nvlink_domain("gb300", 72, 800.0)
        },
        // AMD Instinct MI300X platform: 8 MI300X fully connected by 4th-generation Infinity
        // Fabric, 7 links of 128 GB/s (both directions) per GPU: 448 GB/s each way to all
        // peers; one 400 Gb/s NIC per GPU. The platform is a baseboard whose host each
        // server maker chooses: no host figures.
        "mi300x" => server(
            "mi300x",
            Link {
                latency_us: NVLINK_LATENCY_US,
                bandwidth: 448.0 * GB,
            },
            nics(8, 400.0),
        ),
        // AWS p3dn.24xlarge: 8 V100-SXM2-32GB; NVLink 2.0 at 300 GB/s per GPU in a hybrid
        // cube mesh (a ring uses 2 of its 6 links: 100 GB/s each way); 100 Gb/s (12.5 GB/s)
        // networking per instance. Host: 768 GiB on two Intel Xeon Platinum 8175M, 6
        // channels of DDR4-2666 each; each GPU on PCIe Gen3 x16 (AWS publishes no PCIe
        // topology: the links up to the CPUs are not shared here).
        "p3dn-v100" => NodeGroup {
            host: Some(two_sockets(pcie_x16(8.0), 768 << 30, 6.0, 2666.0)),
            ..server(
                "v100-sxm2-32gb",
                Link {
                    latency_us: NVLINK_LATENCY_US,
                    bandwidth: 100.0 * GB,
                },
                Link {
                    latency_us: NET_LATENCY_US,
                    bandwidth: 12.5 * GB,
                },
            )
        },
        // 8 A100-PCIe-80GB per server without NVLink bridges (no reference server, so no
        // host figures): PCIe 4.0 x16, 16 GT/s × 16
        // lanes × 128/130 = 31.5 GB/s each way; one 100 Gb/s (12.5 GB/s) NIC per node.
        "pcie-a100" => server(
            "a100-pcie-80gb",
            Link {
                latency_us: PCIE_LATENCY_US,
                bandwidth: 31.5 * GB,
            },
            Link {
                latency_us: NET_LATENCY_US,
                bandwidth: 12.5 * GB,
            },
        ),
        _ => return None,
    })
}

impl Cluster {
    /// A built-in cluster: `dgx-a100` (one node) or `dgx-a100x4` (four).
    ///
    /// # Errors
    /// An unknown name, or a node count that is zero or not a number.
    pub fn preset(name: &str) -> Result<Cluster, super::ClusterError> {
        let unknown = || super::ClusterError::UnknownPreset {
            name: name.to_owned(),
        };
        let (base, nodes) = match name.rsplit_once('x') {
            Some((base, n)) if preset_node(base).is_some() => {
                let nodes: u32 = n.parse().ok().filter(|&n| n > 0).ok_or_else(unknown)?;
                (base, nodes)
            }
            _ => (name, 1),
        };
        let node = preset_node(base).ok_or_else(unknown)?;
        Cluster {
            name: base.to_owned(),
            groups: vec![node],
            racks: None,
            flat: None,
        }
        .checked_times(nodes)
    }
}
