//! The machines a plan runs on: GPU types, node groups and the links between GPUs.
//!
//! A cluster is one or more **node groups** (identical servers with `gpus_per_node` GPUs of
//! one type), optionally arranged in racks. Ranks are numbered group by group, node by node,
//! GPU by GPU, as `torchrun` numbers them. Three link levels, each with a latency α (µs) and
//! a bandwidth β (bytes/s, one direction):
//! * **intra-node** (NVLink/NVSwitch or PCIe): β per GPU;
//! * **inter-node** (the node's NICs): β per *node*, shared by its GPUs that talk across
//!   at once;
//! * **inter-rack** (optional): β per node across the rack boundary.
//!
//! A **flat** network (`--link-bandwidth`, `--link-latency`) replaces all three: every pair
//! of GPUs talks at the same α and β, as the planners ralpc is compared with assume.

mod presets;
mod spec;

pub use presets::{gpu_type, GPU_TYPES, PRESETS};
pub use spec::{file_schema, ClusterError};

use serde::{Deserialize, Serialize};

/// Numeric format of the math; selects the peak throughput.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// IEEE single precision on CUDA cores.
    Fp32,
    /// TensorFloat-32 on tensor cores (PyTorch's default for convolutions).
    Tf32,
    /// Half precision on tensor cores.
    Fp16,
    /// bfloat16 on tensor cores.
    Bf16,
    /// FP8 GEMMs as Transformer Engine runs them (E4M3 forward, E5M2 gradients, per-tensor
    /// scales), everything else in bf16 with fp32 master weights.
    Fp8,
    /// MXFP8 GEMMs (E4M3 with one power-of-two scale per 32 elements, Blackwell's tensor
    /// cores scale them natively), everything else in bf16.
    Mxfp8,
}

impl Precision {
    /// Bytes of an activation element training at this precision keeps (mixed precision
    /// keeps 16-bit activations).
    pub fn activation_bytes(self) -> u64 {
        match self {
            Precision::Fp32 | Precision::Tf32 => 4,
            Precision::Fp16 | Precision::Bf16 | Precision::Fp8 | Precision::Mxfp8 => 2,
        }
    }

    /// Whether the GEMMs run in an 8-bit format (the rest of the math in bf16).
    pub fn is_fp8(self) -> bool {
        matches!(self, Precision::Fp8 | Precision::Mxfp8)
    }

    /// All precisions, by name.
    pub const ALL: [Precision; 6] = [
        Precision::Fp32,
        Precision::Tf32,
        Precision::Fp16,
        Precision::Bf16,
        Precision::Fp8,
        Precision::Mxfp8,
    ];

    /// Parses a lower-case name.
    pub fn parse(name: &str) -> Option<Precision> {
        Precision::ALL.into_iter().find(|p| p.name() == name)
    }

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Tf32 => "tf32",
            Precision::Fp16 => "fp16",
            Precision::Bf16 => "bf16",
            Precision::Fp8 => "fp8",
            Precision::Mxfp8 => "mxfp8",
        }
    }
}

/// A GPU's architecture, which sets the fraction of its peaks that real kernels reach
/// ([`crate::cost::rates`]).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Generation {
    /// NVIDIA Volta (V100).
    Volta,
    /// NVIDIA Ampere (A100).
    Ampere,
    /// NVIDIA Hopper (H100, H200).
    Hopper,
    /// NVIDIA Blackwell (B200, GB200, GB300).
    Blackwell,
    /// AMD CDNA 3 (MI300X).
    Cdna3,
    /// Not known: conservative rates.
    #[default]
    Other,
}

impl Generation {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Generation::Volta => "volta",
            Generation::Ampere => "ampere",
            Generation::Hopper => "hopper",
            Generation::Blackwell => "blackwell",
            Generation::Cdna3 => "cdna3",
            Generation::Other => "other",
        }
    }
}

/// One GPU model.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuType {
    /// Name (`a100-sxm4-80gb`).
    pub name: String,
    /// Device memory in bytes.
    pub memory_bytes: u64,
    /// HBM bandwidth, bytes/s.
    pub hbm_bandwidth: f64,
    /// Dense FP32 peak, FLOP/s.
    pub fp32: f64,
    /// Dense TF32 tensor-core peak, FLOP/s (`None`: not supported).
    pub tf32: Option<f64>,
    /// Dense FP16 tensor-core peak, FLOP/s.
    pub fp16: Option<f64>,
    /// Dense BF16 tensor-core peak, FLOP/s.
    pub bf16: Option<f64>,
    /// Dense FP8 tensor-core peak, FLOP/s (`None`: not supported).
    pub fp8: Option<f64>,
    /// The architecture.
    pub generation: Generation,
}

impl GpuType {
    /// Peak throughput at a precision, FLOP/s; `None` when the GPU lacks it.
    pub fn peak(&self, precision: Precision) -> Option<f64> {
        match precision {
            Precision::Fp32 => Some(self.fp32),
            Precision::Tf32 => self.tf32,
            Precision::Fp16 => self.fp16,
            Precision::Bf16 => self.bf16,
            Precision::Fp8 => self.fp8,
            // Block-scaled FP8 runs at the FP8 rate on the tensor cores that scale natively.
            Precision::Mxfp8 => self
                .fp8
                .filter(|_| self.generation == Generation::Blackwell),
        }
    }
}

/// A link class: latency α and bandwidth β.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    /// α, µs.
    pub latency_us: f64,
    /// β, bytes/s in one direction.
    pub bandwidth: f64,
}

impl Link {
    /// Time of one message, µs: α + S/β.
    pub fn transfer_us(&self, bytes: f64) -> f64 {
        self.latency_us + bytes / self.bandwidth * 1e6
    }

    /// The slower of two links (lower bandwidth, higher latency): what a path crossing
    /// both gets.
    pub fn worst(self, other: Link) -> Link {
        Link {
            latency_us: self.latency_us.max(other.latency_us),
            bandwidth: self.bandwidth.min(other.bandwidth),
        }
    }
}

/// Identical servers.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeGroup {
    /// The GPU model of every GPU in the group.
    pub gpu: GpuType,
    /// Number of servers.
    pub nodes: u32,
    /// GPUs per server.
    pub gpus_per_node: u32,
    /// Between two GPUs of one server: β per GPU.
    pub intra_node: Link,
    /// Out of one server: β per server (all its NICs).
    pub network: Link,
    /// The servers' host memory and the GPUs' path to it (`None`: not known, so nothing is
    /// offloaded to it).
    pub host: Option<Host>,
}

/// The host memory a server's GPUs keep state in, as they see it: one host (a two-socket
/// server's CPUs, or one Grace CPU of a superchip) serves `gpus` GPUs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Host {
    /// GPUs one host serves.
    pub gpus: u32,
    /// Between one GPU and its host's memory (PCIe, or NVLink-C2C on Grace superchips): β
    /// per GPU and direction with every GPU of the host copying at once, from the datasheet
    /// ([`Host::copy_link`] is what copies reach).
    pub link: Link,
    /// One host's memory, bytes.
    pub memory_bytes: u64,
    /// One host's memory bandwidth, bytes/s (channels × transfer rate × 8 bytes).
    pub memory_bandwidth: f64,
}

/// Fraction of a host link's datasheet bandwidth that a pinned-memory copy reaches: NVIDIA's
/// nvbandwidth `host_to_device_memcpy_ce` on an H100's PCIe Gen5 x16 link, 55.63 GB/s of
/// 63.0 (NVIDIA technical blog, "NVbandwidth: your essential tool for measuring GPU
/// interconnect and memory performance", 2025). Taken for every host link; no NVLink-C2C
/// measurement is taken.
pub const HOST_COPY_EFFICIENCY: f64 = 55.63 / 63.0;

/// Fraction of the host memory bandwidth a vectorized CPU optimizer step (DeepSpeed's
/// CPU-Adam, the fused loops Megatron-Core's hybrid optimizer runs) reaches: assumed at the
/// fraction STREAM-like kernels reach of GPU memory ([`crate::cost::rates`]' memory-bound
/// rate for an unknown GPU, 0.80); no host measurement is taken.
pub const HOST_STEP_EFFICIENCY: f64 = 0.80;

impl Host {
    /// What one GPU's copies to or from host memory get when `sharers` GPUs of the host
    /// copy at once: the link at [`HOST_COPY_EFFICIENCY`], no more than its share of the
    /// host memory bandwidth.
    pub fn copy_link(&self, sharers: u32) -> Link {
        let share = self.memory_bandwidth / f64::from(sharers.clamp(1, self.gpus.max(1)));
        Link {
            latency_us: self.link.latency_us,
            bandwidth: (self.link.bandwidth * HOST_COPY_EFFICIENCY).min(share),
        }
    }

    /// Host memory bandwidth one GPU's CPU optimizer step gets with `sharers` GPUs of the
    /// host stepping at once, bytes/s.
    pub fn step_bandwidth(&self, sharers: u32) -> f64 {
        self.memory_bandwidth * HOST_STEP_EFFICIENCY / f64::from(sharers.clamp(1, self.gpus.max(1)))
    }

    /// Host memory each of `sharers` GPUs may fill, bytes.
    pub fn memory_share(&self, sharers: u32) -> f64 {
        self.memory_bytes as f64 / f64::from(sharers.clamp(1, self.gpus.max(1)))
    }
}

/// Racks of nodes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Racks {
    /// Consecutive nodes (over all groups) per rack.
    pub nodes_per_rack: u32,
    /// Across racks: β per node.
    pub link: Link,
}

/// A whole cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct Cluster {
    /// Name (a preset name or the file's `name`).
    pub name: String,
    /// Node groups, in rank order.
    pub groups: Vec<NodeGroup>,
    /// Rack arrangement, when nodes span racks.
    pub racks: Option<Racks>,
    /// A flat network overriding every link.
    pub flat: Option<Link>,
}

/// Where a rank sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    /// Its node group.
    pub group: usize,
    /// Its node, counted over all groups.
    pub node: u32,
    /// Its index inside the node.
    pub local: u32,
}

/// The widest boundary a set of ranks spans.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LinkLevel {
    /// One GPU: no communication.
    Device,
    /// One server.
    IntraNode,
    /// Several servers in one rack.
    InterNode,
    /// Several racks.
    InterRack,
}

impl Cluster {
    /// Total GPUs.
    pub fn gpu_count(&self) -> u32 {
        // Saturating: a cluster's size is checked where it is made (`checked_times`).
        self.groups
            .iter()
            .map(|g| g.nodes.saturating_mul(g.gpus_per_node))
            .fold(0, u32::saturating_add)
    }

    /// The least memory of a GPU among ranks `0..ranks` (ranks past the last GPU are the
    /// last group's, as [`Cluster::gpu`] places them): one pass over the groups.
    pub fn smallest_memory(&self, ranks: u32) -> u64 {
        let mut start = 0u32;
        let mut least: Option<u64> = None;
        for g in &self.groups {
            if start < ranks.max(1) {
                least = Some(least.map_or(g.gpu.memory_bytes, |m| m.min(g.gpu.memory_bytes)));
            }
            start = start.saturating_add(g.nodes.saturating_mul(g.gpus_per_node));
        }
        least.unwrap_or(0)
    }

    /// Total servers.
    pub fn node_count(&self) -> u32 {
        self.groups.iter().map(|g| g.nodes).sum()
    }

    /// Where `rank` sits, `None` past the last GPU.
    pub fn locate(&self, rank: u32) -> Option<Location> {
        let (mut first_rank, mut first_node) = (0u32, 0u32);
        for (group, g) in self.groups.iter().enumerate() {
            let size = g.nodes * g.gpus_per_node;
            if rank < first_rank + size {
                let offset = rank - first_rank;
                return Some(Location {
                    group,
                    node: first_node + offset / g.gpus_per_node,
                    local: offset % g.gpus_per_node,
                });
            }
            first_rank += size;
            first_node += g.nodes;
        }
        None
    }

    /// The node group of `rank`, or the last one past the end (callers check ranks first).
    pub fn group_of(&self, rank: u32) -> &NodeGroup {
        let group = self.locate(rank).map_or(self.groups.len() - 1, |l| l.group);
        &self.groups[group]
    }

    /// The GPU model of `rank`.
    pub fn gpu(&self, rank: u32) -> &GpuType {
        &self.group_of(rank).gpu
    }

    /// The rack of server `node` (0 without racks).
    pub fn rack_of(&self, node: u32) -> u32 {
        self.racks.map_or(0, |r| node / r.nodes_per_rack)
    }

    /// The widest boundary the ranks span.
    pub fn level(&self, ranks: &[u32]) -> LinkLevel {
        let locations: Vec<Location> = ranks.iter().filter_map(|&r| self.locate(r)).collect();
        let Some(first) = locations.first() else {
            return LinkLevel::Device;
        };
        if locations.iter().all(|l| l == first) {
            LinkLevel::Device
        } else if locations.iter().all(|l| l.node == first.node) {
            LinkLevel::IntraNode
        } else if locations
            .iter()
            .all(|l| self.rack_of(l.node) == self.rack_of(first.node))
        {
            LinkLevel::InterNode
        } else {
            LinkLevel::InterRack
        }
    }

    /// The link a message between two ranks crosses (β per GPU within a node, per node
    /// beyond); the flat link when one is set.
    pub fn link(&self, a: u32, b: u32) -> Link {
        if let Some(flat) = self.flat {
            return flat;
        }
        let (ga, gb) = (self.group_of(a), self.group_of(b));
        match self.level(&[a, b]) {
            LinkLevel::Device | LinkLevel::IntraNode => ga.intra_node,
            LinkLevel::InterNode => ga.network.worst(gb.network),
            LinkLevel::InterRack => {
                let rack = self.racks.map_or(ga.network, |r| r.link);
                ga.network.worst(gb.network).worst(rack)
            }
        }
    }

    /// The same cluster with every group's node count multiplied by `factor`; see
    /// [`Cluster::checked_times`] for a factor from the user.
    pub fn times(mut self, factor: u32) -> Cluster {
        for g in &mut self.groups {
            g.nodes = g.nodes.saturating_mul(factor);
        }
        if factor > 1 {
            self.name = format!("{}x{factor}", self.name);
        }
        self
    }

    /// [`Cluster::times`], refused when the result would have more GPUs than a cluster
    /// may (a preset's `xN`, `--nodes`): planning for billions of GPUs runs out of time
    /// and memory before it says anything.
    ///
    /// # Errors
    /// [`ClusterError::TooLarge`].
    pub fn checked_times(self, factor: u32) -> Result<Cluster, ClusterError> {
        let gpus = u64::from(factor)
            * self
                .groups
                .iter()
                .map(|g| u64::from(g.nodes) * u64::from(g.gpus_per_node))
                .sum::<u64>();
        if gpus > spec::MAX_GPUS {
            return Err(ClusterError::TooLarge {
                name: format!("{}x{factor}", self.name),
                gpus,
            });
        }
        Ok(self.times(factor))
    }

    /// The same GPUs on a flat network.
    pub fn with_flat_network(mut self, link: Link) -> Cluster {
        self.flat = Some(link);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_dgx() -> Cluster {
        Cluster::preset("dgx-a100x2").unwrap()
    }

    #[test]
    fn ranks_are_numbered_node_by_node() {
        let c = two_dgx();
        assert_eq!(c.gpu_count(), 16);
        assert_eq!(
            c.locate(9),
            Some(Location {
                group: 0,
                node: 1,
                local: 1
            })
        );
        assert_eq!(c.locate(16), None);
    }

    #[test]
    fn levels_follow_where_ranks_sit() {
        let c = two_dgx();
        assert_eq!(c.level(&[3]), LinkLevel::Device);
        assert_eq!(c.level(&[0, 7]), LinkLevel::IntraNode);
        assert_eq!(c.level(&[0, 8]), LinkLevel::InterNode);
        assert_eq!(c.link(0, 7).bandwidth, 300e9);
        assert_eq!(c.link(0, 8).bandwidth, 200e9);
        let racked = Cluster {
            racks: Some(Racks {
                nodes_per_rack: 1,
                link: Link {
                    latency_us: 20.0,
                    bandwidth: 50e9,
                },
            }),
            ..c
        };
        assert_eq!(racked.level(&[0, 8]), LinkLevel::InterRack);
        assert_eq!(racked.link(0, 8).bandwidth, 50e9);
        assert_eq!(racked.link(0, 8).latency_us, 20.0);
    }

    #[test]
    fn flat_network_overrides_every_link() {
        let flat = Link {
            latency_us: 0.0,
            bandwidth: 1e9,
        };
        let c = two_dgx().with_flat_network(flat);
        assert_eq!(c.link(0, 1), flat);
        assert_eq!(c.link(0, 15), flat);
    }

    #[test]
    fn a_message_costs_alpha_plus_size_over_beta() {
        let link = Link {
            latency_us: 5.0,
            bandwidth: 1e9,
        };
        // 1 MB at 1 GB/s is 1000 µs.
        assert_eq!(link.transfer_us(1e6), 1005.0);
    }
}
