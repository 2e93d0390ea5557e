//! `ralpc cluster [PRESET|FILE] [--nodes N] [--link-bandwidth B --link-latency L] [--toml]`.

use ralpc::passes::cluster::{Link, GPU_TYPES, PRESETS};
use ralpc::passes::units::{parse_bandwidth, parse_latency};
use ralpc::ClusterOptions;

pub const EXAMPLES: &str = "\
Examples:
  ralpc cluster                      # the default, dgx-a100
  ralpc cluster dgx-h100x4           # four DGX H100 nodes
  ralpc cluster p3dn-v100 --nodes 2 --toml > lab.toml   # a file to edit
  ralpc cluster lab.toml
  ralpc cluster dgx-a100 --link-bandwidth 1GB/s --link-latency 0us   # flat network";

/// Arguments of `ralpc cluster`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A preset (dgx-a100, dgx-h100, p3dn-v100, pcie-a100, selene, eos; `NAMExN` for N nodes) or a
    /// cluster TOML file.
    pub cluster: Option<String>,
    /// Multiply the number of nodes.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub nodes: Option<u32>,
    /// Make the network flat: every pair of GPUs at this bandwidth (e.g. `1GB/s`).
    #[arg(long, value_parser = parse_bandwidth)]
    pub link_bandwidth: Option<f64>,
    /// Latency of every link of the flat network (e.g. `0us`; default 0).
    #[arg(long, value_parser = parse_latency, requires = "link_bandwidth")]
    pub link_latency: Option<f64>,
    /// Print the cluster as a self-contained TOML file instead of a summary.
    #[arg(long)]
    pub toml: bool,
    /// List the presets and GPU types.
    #[arg(long, conflicts_with_all = ["cluster", "toml"])]
    pub list: bool,
}

pub fn run(args: &Args) -> Result<(), ralpc::Error> {
    if args.list {
        let text = format!(
            "cluster presets (NAMExN for N nodes): {}\nGPU types: {}\n",
            PRESETS.join(", "),
            GPU_TYPES.join(", ")
        );
        super::print_stdout(&text);
        return Ok(());
    }
    let options = ClusterOptions {
        spec: args.cluster.clone(),
        nodes: args.nodes,
        flat: args.link_bandwidth.map(|bandwidth| Link {
            bandwidth,
            latency_us: args.link_latency.unwrap_or(0.0),
        }),
    };
    let cluster = ralpc::cluster(&options)?;
    let text = if args.toml {
        cluster.to_toml()
    } else {
        cluster.describe()
    };
    super::print_stdout(&text);
    Ok(())
}
