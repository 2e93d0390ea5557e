//! Cluster files (TOML) and how a `--cluster` argument is resolved.
//!
//! ```toml
//! name = "lab"                     # optional
//!
//! [[group]]                        # identical servers; ranks are numbered group by group
//! preset = "dgx-a100"              # start from a built-in node (optional) ...
//! nodes = 2                        # ... and override any field
//!
//! [[group]]
//! nodes = 4
//! gpus_per_node = 8
//! gpu = "v100-sxm2-32gb"           # a built-in GPU type, or a table:
//! # gpu = { name = "x", memory = "32GiB", hbm_bandwidth = "900GB/s", fp32 = "15.7TFLOPS",
//! #         tf32 = "...", fp16 = "125TFLOPS", bf16 = "...", fp8 = "...",
//! #         generation = "hopper" }   # tf32/fp16/bf16/fp8 optional; generation: volta,
//! #                                   # ampere, hopper, blackwell, cdna3 or other (default)
//! intra_node = { bandwidth = "100GB/s", latency = "3.4us" }   # per GPU, one direction
//! network = { bandwidth = "12.5GB/s", latency = "9.6us" }     # per node, one direction
//! # host memory (optional; without it nothing is offloaded): one host serves `gpus` GPUs
//! # (default: the node's); each GPU's link to it per direction with every GPU copying at
//! # once; one host's memory and bandwidth
//! host = { gpus = 8, link = { bandwidth = "31.5GB/s", latency = "5.7us" }, memory = "1TiB",
//!          memory_bandwidth = "409.6GB/s" }
//!
//! [racks]                          # optional
//! nodes_per_rack = 4
//! bandwidth = "50GB/s"             # per node across racks
//! latency = "20us"
//!
//! [flat]                           # optional: one link for every pair of GPUs
//! bandwidth = "1GB/s"
//! latency = "0us"
//! ```

use std::path::Path;

use ralpc_ir::input::{read_input_text, InputKind};
use serde::{Deserialize, Serialize};

use super::presets::{gpu_type, preset_node, GPU_TYPES, PRESETS};
use super::{Cluster, Generation, GpuType, Host, Link, NodeGroup, Racks};
use crate::units::{
    parse_bandwidth, parse_bytes, parse_flops, parse_latency, Bandwidth, QuantityError, Throughput,
};

/// Why a cluster could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// Not a preset and not a file.
    #[error("unknown cluster '{name}': not a file, and not a preset ({}, each with an optional xN node count, e.g. dgx-a100x4)", PRESETS.join(", "))]
    UnknownPreset {
        /// What was asked for.
        name: String,
    },
    /// The file could not be read.
    #[error("cannot read cluster file {path}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML or does not follow the schema.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// The TOML error, with line and column.
        message: String,
    },
    /// More GPUs than one cluster may have ([`MAX_GPUS`]): a preset's `xN` or `--nodes`.
    #[error("{name}: {gpus} GPUs; a cluster has at most {MAX_GPUS}")]
    TooLarge {
        /// The cluster and its node count.
        name: String,
        /// The GPUs it would have.
        gpus: u64,
    },
    /// A field's value is wrong.
    #[error("{path}: {field}: {message}")]
    Field {
        /// The file.
        path: String,
        /// The field (`group[1].gpu`).
        field: String,
        /// What is wrong.
        message: String,
    },
}

/// The JSON Schema of cluster files (their TOML read as JSON).
pub fn file_schema() -> schemars::Schema {
    schemars::schema_for!(FileSpec)
}

/// A cluster file: groups of identical servers, optionally racks or one flat link.
#[derive(Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    /// The cluster's name (default: the file's stem).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    /// Groups of identical servers; ranks are numbered group by group.
    #[serde(default, rename = "group")]
    groups: Vec<GroupSpec>,
    /// Racks: nodes per rack and the link between racks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    racks: Option<RacksSpec>,
    /// One link for every pair of GPUs, instead of the node and rack hierarchy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    flat: Option<LinkSpec>,
}

/// Identical servers.
#[derive(Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct GroupSpec {
    /// A built-in node to start from (`dgx-a100`); the other fields override it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    preset: Option<String>,
    /// Servers in the group (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nodes: Option<u32>,
    /// GPUs per server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gpus_per_node: Option<u32>,
    /// The GPU: a built-in type's name or a table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gpu: Option<GpuSpec>,
    /// The link between GPUs of one server, per GPU and direction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    intra_node: Option<LinkSpec>,
    /// The link between servers, per server and direction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    network: Option<LinkSpec>,
    /// The servers' host memory, where optimizer state and activations may be offloaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    host: Option<HostSpec>,
}

/// A host's memory and its GPUs' link to it.
#[derive(Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct HostSpec {
    /// GPUs one host serves (2 for a Grace superchip; default: every GPU of the server).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gpus: Option<u32>,
    /// Between one GPU and host memory, per GPU and direction with every GPU copying at
    /// once (the datasheet's figure: `63GB/s` for PCIe Gen5 x16).
    link: LinkSpec,
    /// One host's memory (`2TiB`).
    memory: String,
    /// One host's memory bandwidth (`614.4GB/s`).
    memory_bandwidth: String,
}

/// A GPU type: built-in by name (`a100-sxm4-80gb`), or described.
#[derive(Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(untagged)]
enum GpuSpec {
    /// A built-in GPU type.
    Named(String),
    /// A GPU described by its figures.
    Custom(CustomGpu),
}

/// A GPU described by its figures; quantities are strings with units.
#[derive(Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct CustomGpu {
    /// Its name.
    name: String,
    /// Memory (`80GiB`).
    memory: String,
    /// Memory bandwidth (`2039GB/s`).
    hbm_bandwidth: String,
    /// FP32 peak (`19.5TFLOPS`).
    fp32: String,
    /// TF32 tensor-core peak.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tf32: Option<String>,
    /// FP16 tensor-core peak.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fp16: Option<String>,
    /// BF16 tensor-core peak.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    bf16: Option<String>,
    /// FP8 tensor-core peak.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fp8: Option<String>,
    /// The architecture, which sets how much of the peaks kernels reach (default: other).
    #[serde(default)]
    generation: Generation,
}

/// A link: bandwidth per direction (`300GB/s`, `200Gb/s`) and latency (`3.4us`).
#[derive(Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct LinkSpec {
    /// Bandwidth per direction.
    bandwidth: String,
    /// Latency.
    latency: String,
}

/// Racks of nodes.
#[derive(Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RacksSpec {
    /// Nodes in one rack.
    nodes_per_rack: u32,
    /// Bandwidth per node across racks, per direction.
    bandwidth: String,
    /// Latency across racks.
    latency: String,
}

/// Converts spec fields, naming the field in errors.
struct Fields<'a> {
    path: &'a str,
}

impl Fields<'_> {
    fn error(&self, field: &str, message: impl ToString) -> ClusterError {
        ClusterError::Field {
            path: self.path.to_owned(),
            field: field.to_owned(),
            message: message.to_string(),
        }
    }

    fn quantity<T>(
        &self,
        field: &str,
        text: &str,
        parse: fn(&str) -> Result<T, QuantityError>,
    ) -> Result<T, ClusterError> {
        parse(text).map_err(|e| self.error(field, e))
    }

    fn link(&self, field: &str, spec: &LinkSpec) -> Result<Link, ClusterError> {
        Ok(Link {
            bandwidth: self.quantity(
                &format!("{field}.bandwidth"),
                &spec.bandwidth,
                parse_bandwidth,
            )?,
            latency_us: self.quantity(&format!("{field}.latency"), &spec.latency, parse_latency)?,
        })
    }

    fn host(&self, field: &str, spec: &HostSpec, gpus_per_node: u32) -> Result<Host, ClusterError> {
        let gpus = spec.gpus.unwrap_or(gpus_per_node);
        if gpus == 0 {
            return Err(self.error(&format!("{field}.gpus"), "must be at least 1"));
        }
        Ok(Host {
            gpus,
            link: self.link(&format!("{field}.link"), &spec.link)?,
            memory_bytes: self.quantity(&format!("{field}.memory"), &spec.memory, parse_bytes)?,
            memory_bandwidth: self.quantity(
                &format!("{field}.memory_bandwidth"),
                &spec.memory_bandwidth,
                parse_bandwidth,
            )?,
        })
    }

    fn gpu(&self, field: &str, spec: &GpuSpec) -> Result<GpuType, ClusterError> {
        match spec {
            GpuSpec::Named(name) => gpu_type(name).ok_or_else(|| {
                self.error(
                    field,
                    format!(
                        "unknown GPU type '{name}' (built-in: {})",
                        GPU_TYPES.join(", ")
                    ),
                )
            }),
            GpuSpec::Custom(c) => {
                let optional = |key: &str, text: &Option<String>| {
                    text.as_deref()
                        .map(|t| self.quantity(&format!("{field}.{key}"), t, parse_flops))
                        .transpose()
                };
                Ok(GpuType {
                    name: c.name.clone(),
                    memory_bytes: self.quantity(
                        &format!("{field}.memory"),
                        &c.memory,
                        parse_bytes,
                    )?,
                    hbm_bandwidth: self.quantity(
                        &format!("{field}.hbm_bandwidth"),
                        &c.hbm_bandwidth,
                        parse_bandwidth,
                    )?,
                    fp32: self.quantity(&format!("{field}.fp32"), &c.fp32, parse_flops)?,
                    tf32: optional("tf32", &c.tf32)?,
                    fp16: optional("fp16", &c.fp16)?,
                    bf16: optional("bf16", &c.bf16)?,
                    fp8: optional("fp8", &c.fp8)?,
                    generation: c.generation,
                })
            }
        }
    }

    fn group(&self, index: usize, spec: &GroupSpec) -> Result<NodeGroup, ClusterError> {
        let field = |name: &str| format!("group[{index}].{name}");
        let base = match &spec.preset {
            Some(name) => Some(preset_node(name).ok_or_else(|| {
                self.error(
                    &field("preset"),
                    format!("unknown preset '{name}' (built-in: {})", PRESETS.join(", ")),
                )
            })?),
            None => None,
        };
        let missing =
            |name: &str| self.error(&field(name), "missing (and no preset to take it from)");
        let gpu = match &spec.gpu {
            Some(gpu) => self.gpu(&field("gpu"), gpu)?,
            None => base
                .as_ref()
                .map(|b| b.gpu.clone())
                .ok_or_else(|| missing("gpu"))?,
        };
        let link = |name: &str, spec: &Option<LinkSpec>, from_base: Option<Link>| match spec {
            Some(s) => self.link(&field(name), s),
            None => from_base.ok_or_else(|| missing(name)),
        };
        let group = NodeGroup {
            gpu,
            nodes: spec.nodes.unwrap_or(1),
            gpus_per_node: spec
                .gpus_per_node
                .or(base.as_ref().map(|b| b.gpus_per_node))
                .ok_or_else(|| missing("gpus_per_node"))?,
            intra_node: link(
                "intra_node",
                &spec.intra_node,
                base.as_ref().map(|b| b.intra_node),
            )?,
            network: link("network", &spec.network, base.as_ref().map(|b| b.network))?,
            host: None,
        };
        let group = NodeGroup {
            host: match &spec.host {
                Some(host) => Some(self.host(&field("host"), host, group.gpus_per_node.max(1))?),
                // A preset's host serves no more GPUs than the node now has.
                None => base.as_ref().and_then(|b| b.host).map(|h| Host {
                    gpus: h.gpus.min(group.gpus_per_node.max(1)),
                    ..h
                }),
            },
            ..group
        };
        if group.nodes == 0 {
            return Err(self.error(&field("nodes"), "must be at least 1"));
        }
        if group.gpus_per_node == 0 {
            return Err(self.error(&field("gpus_per_node"), "must be at least 1"));
        }
        Ok(group)
    }
}

/// Total GPUs beyond which a cluster is refused (ranks are `u32`, and plans list ranks).
pub(crate) const MAX_GPUS: u64 = 1 << 20;

impl Cluster {
    /// Parses a cluster file's text; `path` names it in errors.
    ///
    /// # Errors
    /// Invalid TOML, an unknown field, a missing or malformed value.
    pub fn from_toml(text: &str, path: &str) -> Result<Cluster, ClusterError> {
        let spec: FileSpec = toml::from_str(text).map_err(|e| ClusterError::Parse {
            path: path.to_owned(),
            message: e.to_string().trim_end().to_owned(),
        })?;
        let fields = Fields { path };
        if spec.groups.is_empty() {
            return Err(fields.error("group", "a cluster needs at least one [[group]]"));
        }
        let groups = spec
            .groups
            .iter()
            .enumerate()
            .map(|(i, g)| fields.group(i, g))
            .collect::<Result<Vec<_>, _>>()?;
        let gpus: u64 = groups
            .iter()
            .map(|g| u64::from(g.nodes) * u64::from(g.gpus_per_node))
            .sum();
        if gpus > MAX_GPUS {
            return Err(fields.error("group", format!("{gpus} GPUs in all; at most {MAX_GPUS}")));
        }
        let racks = match &spec.racks {
            Some(r) if r.nodes_per_rack == 0 => {
                return Err(fields.error("racks.nodes_per_rack", "must be at least 1"))
            }
            Some(r) => Some(Racks {
                nodes_per_rack: r.nodes_per_rack,
                link: fields.link(
                    "racks",
                    &LinkSpec {
                        bandwidth: r.bandwidth.clone(),
                        latency: r.latency.clone(),
                    },
                )?,
            }),
            None => None,
        };
        let flat = spec
            .flat
            .as_ref()
            .map(|f| fields.link("flat", f))
            .transpose()?;
        let name = spec.name.unwrap_or_else(|| {
            Path::new(path).file_stem().map_or_else(
                || "cluster".to_owned(),
                |s| s.to_string_lossy().into_owned(),
            )
        });
        Ok(Cluster {
            name,
            groups,
            racks,
            flat,
        })
    }

    /// A preset name (`dgx-a100x4`) or the path of a cluster file.
    ///
    /// # Errors
    /// See [`Cluster::preset`] and [`Cluster::from_toml`].
    pub fn resolve(spec: &str) -> Result<Cluster, ClusterError> {
        let path = Path::new(spec);
        if path.is_file() || spec.ends_with(".toml") {
            let text =
                read_input_text(path, InputKind::Text).map_err(|source| ClusterError::Read {
                    path: spec.to_owned(),
                    source,
                })?;
            return Cluster::from_toml(&text, spec);
        }
        Cluster::preset(spec)
    }

    /// The cluster as a self-contained file (every field explicit; reads back equal).
    pub fn to_toml(&self) -> String {
        let link = |l: &Link| LinkSpec {
            bandwidth: format!("{}B/s", l.bandwidth),
            latency: format!("{}us", l.latency_us),
        };
        let flops = |f: f64| format!("{f}FLOPS");
        let spec = FileSpec {
            name: Some(self.name.clone()),
            groups: self
                .groups
                .iter()
                .map(|g| GroupSpec {
                    preset: None,
                    nodes: Some(g.nodes),
                    gpus_per_node: Some(g.gpus_per_node),
                    gpu: Some(GpuSpec::Custom(CustomGpu {
                        name: g.gpu.name.clone(),
                        memory: format!("{}B", g.gpu.memory_bytes),
                        hbm_bandwidth: format!("{}B/s", g.gpu.hbm_bandwidth),
                        fp32: flops(g.gpu.fp32),
                        tf32: g.gpu.tf32.map(flops),
                        fp16: g.gpu.fp16.map(flops),
                        bf16: g.gpu.bf16.map(flops),
                        fp8: g.gpu.fp8.map(flops),
                        generation: g.gpu.generation,
                    })),
                    intra_node: Some(link(&g.intra_node)),
                    network: Some(link(&g.network)),
                    host: g.host.map(|h| HostSpec {
                        gpus: Some(h.gpus),
                        link: link(&h.link),
                        memory: format!("{}B", h.memory_bytes),
                        memory_bandwidth: format!("{}B/s", h.memory_bandwidth),
                    }),
                })
                .collect(),
            racks: self.racks.map(|r| RacksSpec {
                nodes_per_rack: r.nodes_per_rack,
                bandwidth: format!("{}B/s", r.link.bandwidth),
                latency: format!("{}us", r.link.latency_us),
            }),
            flat: self.flat.as_ref().map(link),
        };
        toml::to_string(&spec).expect("cluster specs always serialize")
    }

    /// A human summary, one line per node group.
    pub fn describe(&self) -> String {
        let nodes = self.node_count();
        let plural = if nodes == 1 { "" } else { "s" };
        let mut out = format!(
            "{}: {} GPUs on {nodes} node{plural}\n",
            self.name,
            self.gpu_count()
        );
        for g in &self.groups {
            out += &format!(
                "  {} x {} {} ({}, {} GiB, HBM {}, FP32 {}, TF32 {}, FP16 {}, BF16 {}, FP8 {})\n",
                g.nodes,
                g.gpus_per_node,
                g.gpu.name,
                g.gpu.generation.name(),
                g.gpu.memory_bytes >> 30,
                Bandwidth(g.gpu.hbm_bandwidth),
                Throughput(g.gpu.fp32),
                g.gpu.tf32.map_or("-".into(), |f| Throughput(f).to_string()),
                g.gpu.fp16.map_or("-".into(), |f| Throughput(f).to_string()),
                g.gpu.bf16.map_or("-".into(), |f| Throughput(f).to_string()),
                g.gpu.fp8.map_or("-".into(), |f| Throughput(f).to_string()),
            );
            out += &format!(
                "    intra-node {} per GPU, α {} µs; network {} per node, α {} µs\n",
                Bandwidth(g.intra_node.bandwidth),
                g.intra_node.latency_us,
                Bandwidth(g.network.bandwidth),
                g.network.latency_us,
            );
            if let Some(h) = g.host {
                out += &format!(
                    "    host {} GiB at {} for {} GPUs; {} per GPU to it, α {} µs\n",
                    h.memory_bytes >> 30,
                    Bandwidth(h.memory_bandwidth),
                    h.gpus,
                    Bandwidth(h.link.bandwidth),
                    h.link.latency_us,
                );
            }
        }
        if let Some(r) = self.racks {
            out += &format!(
                "  racks of {} nodes: {} per node, α {} µs\n",
                r.nodes_per_rack,
                Bandwidth(r.link.bandwidth),
                r.link.latency_us
            );
        }
        if let Some(f) = self.flat {
            out += &format!(
                "  flat network: every link {}, α {} µs\n",
                Bandwidth(f.bandwidth),
                f.latency_us
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_round_trip_through_toml() {
        for name in PRESETS {
            let cluster = Cluster::preset(&format!("{name}x3")).unwrap();
            assert_eq!(cluster.gpu_count(), 3 * cluster.groups[0].gpus_per_node);
            let back = Cluster::from_toml(&cluster.to_toml(), "t.toml").unwrap();
            assert_eq!(back, cluster, "{name}");
        }
    }

    #[test]
    fn heterogeneous_groups_from_presets() {
        let text = r#"
            name = "mixed"
            [[group]]
            preset = "dgx-a100"
            nodes = 2
            [[group]]
            preset = "p3dn-v100"
            nodes = 1
            gpus_per_node = 4
        "#;
        let c = Cluster::from_toml(text, "mixed.toml").unwrap();
        assert_eq!(c.gpu_count(), 20);
        assert_eq!(c.gpu(15).name, "a100-sxm4-80gb");
        assert_eq!(c.gpu(16).name, "v100-sxm2-32gb");
        // Between groups, the slower network.
        assert_eq!(c.link(0, 16).bandwidth, 12.5e9);
        let back = Cluster::from_toml(&c.to_toml(), "t.toml").unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn custom_gpu_and_flat_network() {
        let text = r#"
            [[group]]
            nodes = 1
            gpus_per_node = 2
            gpu = { name = "toy", memory = "16GiB", hbm_bandwidth = "1TB/s", fp32 = "10TFLOPS" }
            intra_node = { bandwidth = "10GB/s", latency = "1us" }
            network = { bandwidth = "1GB/s", latency = "10us" }
            [flat]
            bandwidth = "1GB/s"
            latency = "0us"
        "#;
        let c = Cluster::from_toml(text, "dir/toy.toml").unwrap();
        assert_eq!(c.name, "toy");
        assert_eq!(c.gpu(0).peak(super::super::Precision::Fp16), None);
        assert_eq!(c.link(0, 1).bandwidth, 1e9);
    }

    #[test]
    fn host_figures_are_read_or_inherited() {
        let text = r#"
            [[group]]
            preset = "pcie-a100"
            host = { link = { bandwidth = "31.5GB/s", latency = "5.7us" }, memory = "1TiB", memory_bandwidth = "409.6GB/s" }
            [[group]]
            preset = "dgx-h100"
        "#;
        let c = Cluster::from_toml(text, "h.toml").unwrap();
        let host = c.groups[0].host.expect("given");
        assert_eq!(host.memory_bytes, 1 << 40);
        assert_eq!(host.link.bandwidth, 31.5e9);
        assert_eq!(host.memory_bandwidth, 409.6e9);
        assert_eq!(c.groups[1].host, preset_node("dgx-h100").unwrap().host);
        // Every GPU of the server copying at once: the link at the copy efficiency, or the
        // host memory's share when it is the narrower.
        assert_eq!(
            host.copy_link(8).bandwidth,
            31.5e9 * super::super::HOST_COPY_EFFICIENCY
        );
        let narrow = Host {
            memory_bandwidth: 100e9,
            ..host
        };
        assert_eq!(narrow.copy_link(8).bandwidth, 100e9 / 8.0);
        assert_eq!(narrow.copy_link(64).bandwidth, 100e9 / 8.0);
        assert_eq!(narrow.copy_link(1).bandwidth, host.copy_link(8).bandwidth);
        assert_eq!(Cluster::from_toml(&c.to_toml(), "t.toml").unwrap(), c);
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            ("[[group]]\npreset = \"dgx-z\"\n", "group[0].preset"),
            ("[[group]]\ngpus_per_node = 8\n", "group[0].gpu"),
            ("[[group]]\npreset = \"dgx-a100\"\nnodes = 0\n", "group[0].nodes"),
            (
                "[[group]]\npreset = \"dgx-a100\"\nnetwork = { bandwidth = \"fast\", latency = \"1us\" }\n",
                "group[0].network.bandwidth",
            ),
            ("[[group]]\npreset = \"dgx-a100\"\ncolour = 1\n", "unknown field `colour`"),
            (
                "[[group]]\npreset = \"dgx-a100\"\nhost = { link = { bandwidth = \"1GB/s\", \
                 latency = \"1us\" }, memory = \"lots\", memory_bandwidth = \"1GB/s\" }\n",
                "group[0].host.memory",
            ),
            ("name = \"x\"\n", "at least one [[group]]"),
            ("[[group]\n", "t.toml"),
            ("[[group]]\npreset = \"dgx-a100\"\nnodes = 1048577\n", "at most"),
        ];
        for (text, expected) in cases {
            let message = Cluster::from_toml(text, "t.toml").unwrap_err().to_string();
            assert!(message.contains(expected), "{text:?}: {message}");
        }
    }

    #[test]
    fn resolve_presets_and_unknown_names() {
        assert_eq!(Cluster::resolve("dgx-h100x4").unwrap().gpu_count(), 32);
        for bad in ["dgx-a100x0", "dgx-a100xx", "tpu-v4", "missing.toml"] {
            assert!(Cluster::resolve(bad).is_err(), "{bad}");
        }
    }
}
