//! Resolving `--cluster`, `--nodes` and the flat-network overrides into a [`Cluster`].

use ralpc_passes::cluster::{Cluster, Link};

use crate::Error;

/// What the user asked for.
#[derive(Clone, Debug, Default)]
pub struct ClusterOptions {
    /// A preset (`dgx-a100`, `dgx-a100x4`) or a TOML file; `dgx-a100` when `None`.
    pub spec: Option<String>,
    /// Multiply the node count.
    pub nodes: Option<u32>,
    /// Every link at this bandwidth (bytes/s) and latency (µs): a flat network.
    pub flat: Option<Link>,
}

/// The preset used when none is named.
pub const DEFAULT_CLUSTER: &str = "dgx-a100";

/// Builds the cluster a command runs against.
///
/// # Errors
/// An unknown preset, an unreadable or invalid cluster file.
pub fn cluster(options: &ClusterOptions) -> Result<Cluster, Error> {
    let spec = options.spec.as_deref().unwrap_or(DEFAULT_CLUSTER);
    let mut cluster = Cluster::resolve(spec).map_err(|e| Error::Cluster(Box::new(e)))?;
    if let Some(n) = options.nodes {
        cluster = cluster
            .checked_times(n)
            .map_err(|e| Error::Cluster(Box::new(e)))?;
    }
    if let Some(link) = options.flat {
        cluster = cluster.with_flat_network(link);
    }
    Ok(cluster)
}
