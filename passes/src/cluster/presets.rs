//! Built-in GPU types and cluster presets. Every figure names its source.
//!
//! Throughputs are *dense* peaks (NVIDIA's datasheets print tensor-core figures "with
//! sparsity", twice the dense ones; ralpc uses the dense half). Link bandwidths are per
//! direction: NVIDIA quotes NVLink as the sum of both directions.
//!
//! Latencies α are NCCL's own per-step figures for its ring algorithm with the Simple
//! protocol (the one used for large messages), from its tuning model
//! (`src/graph/tuning.cc`, `hwLat`): NVLink 3.4 µs, PCIe 5.7 µs, network 9.6 µs.

use super::{Cluster, GpuType, Link, NodeGroup};

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
    "h100-sxm5-80gb",
    "v100-sxm2-32gb",
];

/// A built-in GPU type by name.
pub fn gpu_type(name: &str) -> Option<GpuType> {
    Some(match name {
        // NVIDIA A100 Tensor Core GPU datasheet (2021), SXM column: FP32 19.5 TFLOPS,
        // TF32 156, BF16/FP16 312 (dense), 80 GB HBM2e at 2,039 GB/s.
        "a100-sxm4-80gb" => GpuType {
            name: name.into(),
            memory_bytes: 80 * GIB,
            hbm_bandwidth: 2039.0 * GB,
            fp32: 19.5 * TERA,
            tf32: Some(156.0 * TERA),
            fp16: Some(312.0 * TERA),
            bf16: Some(312.0 * TERA),
        },
        // Same datasheet, PCIe column: the same peaks, 80 GB HBM2e at 1,935 GB/s.
        "a100-pcie-80gb" => GpuType {
            name: name.into(),
            memory_bytes: 80 * GIB,
            hbm_bandwidth: 1935.0 * GB,
            fp32: 19.5 * TERA,
            tf32: Some(156.0 * TERA),
            fp16: Some(312.0 * TERA),
            bf16: Some(312.0 * TERA),
        },
        // NVIDIA H100 Tensor Core GPU datasheet, SXM column: FP32 67 TFLOPS, TF32 989 /
        // BF16 and FP16 1,979 "with sparsity" (dense: half), 80 GB HBM3 at 3.35 TB/s.
        "h100-sxm5-80gb" => GpuType {
            name: name.into(),
            memory_bytes: 80 * GIB,
            hbm_bandwidth: 3350.0 * GB,
            fp32: 67.0 * TERA,
            tf32: Some(494.5 * TERA),
            fp16: Some(989.5 * TERA),
            bf16: Some(989.5 * TERA),
        },
        // NVIDIA V100 Tensor Core GPU datasheet, SXM2 column: FP32 15.7 TFLOPS, tensor
        // (FP16) 125 TFLOPS, 32 GB HBM2 at 900 GB/s; Volta has no TF32 or BF16.
        "v100-sxm2-32gb" => GpuType {
            name: name.into(),
            memory_bytes: 32 * GIB,
            hbm_bandwidth: 900.0 * GB,
            fp32: 15.7 * TERA,
            tf32: None,
            fp16: Some(125.0 * TERA),
            bf16: None,
        },
        _ => return None,
    })
}

/// Names of the built-in clusters (one node each; `NAMExN` for N nodes).
pub const PRESETS: &[&str] = &[
    "dgx-a100",
    "dgx-h100",
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
    }
}

/// One node of a built-in cluster.
pub(super) fn preset_node(name: &str) -> Option<NodeGroup> {
    Some(match name {
        // NVIDIA DGX A100 user guide: 8 A100-SXM4-80GB on NVSwitch, 600 GB/s of NVLink per
        // GPU (both directions: 300 GB/s each way); 8 single-port ConnectX-6 HDR InfiniBand
        // at 200 Gb/s (25 GB/s) each, 200 GB/s per node.
        "dgx-a100" => server(
            "a100-sxm4-80gb",
            Link {
                latency_us: NVLINK_LATENCY_US,
                bandwidth: 300.0 * GB,
            },
            Link {
                latency_us: NET_LATENCY_US,
                bandwidth: 8.0 * 25.0 * GB,
            },
        ),
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
        // each, 400 GB/s per node.
        "dgx-h100" => server(
            "h100-sxm5-80gb",
            Link {
                latency_us: NVLINK_LATENCY_US,
                bandwidth: 450.0 * GB,
            },
            Link {
                latency_us: NET_LATENCY_US,
                bandwidth: 8.0 * 50.0 * GB,
            },
        ),
        // AWS p3dn.24xlarge: 8 V100-SXM2-32GB; NVLink 2.0 at 300 GB/s per GPU in a hybrid
        // cube mesh (a ring uses 2 of its 6 links: 100 GB/s each way); 100 Gb/s (12.5 GB/s)
        // networking per instance.
        "p3dn-v100" => server(
            "v100-sxm2-32gb",
            Link {
                latency_us: NVLINK_LATENCY_US,
                bandwidth: 100.0 * GB,
            },
            Link {
                latency_us: NET_LATENCY_US,
                bandwidth: 12.5 * GB,
            },
        ),
        // 8 A100-PCIe-80GB per server without NVLink bridges: PCIe 4.0 x16, 16 GT/s × 16
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
        Ok(Cluster {
            name: base.to_owned(),
            groups: vec![node],
            racks: None,
            flat: None,
        }
        .times(nodes))
    }
}
