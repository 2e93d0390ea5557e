//! Communication costs: the α-β model of point-to-point messages and NCCL's ring
//! collectives, with the link class chosen from where the ranks sit.
//!
//! `S` is the size of the whole tensor: an all-reduce reduces S bytes on every rank, an
//! all-gather leaves S bytes on every rank, a reduce-scatter leaves S/n.

use crate::cluster::{Cluster, Link, LinkLevel};

/// Point to point: α + S/β, µs.
pub fn p2p_us(link: Link, bytes: f64) -> f64 {
    link.transfer_us(bytes)
}

/// Ring all-reduce over `n` ranks: 2(n−1)α + 2(n−1)/n · S/β, µs.
pub fn ring_all_reduce_us(n: u32, link: Link, bytes: f64) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    let steps = 2.0 * f64::from(n - 1);
    steps * link.latency_us + steps / f64::from(n) * bytes / link.bandwidth * 1e6
}

/// Ring all-gather (or reduce-scatter) over `n` ranks: (n−1)α + (n−1)/n · S/β, µs.
pub fn ring_all_gather_us(n: u32, link: Link, bytes: f64) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    let steps = f64::from(n - 1);
    steps * link.latency_us + steps / f64::from(n) * bytes / link.bandwidth * 1e6
}

/// How an all-reduce is run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    /// No communication (one rank).
    None,
    /// One ring over all ranks, at the slowest link it crosses.
    Ring,
    /// Reduce-scatter inside each node, all-reduce across nodes, all-gather inside.
    Hierarchical,
}

/// A collective's predicted time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Collective {
    /// µs.
    pub us: f64,
    /// The part of `us` that is the links' latency (its steps' α): time during which no
    /// bytes hold the links, so collectives sharing a server's network overlap in it.
    pub latency_us: f64,
    /// How.
    pub algorithm: Algorithm,
    /// The widest boundary it crosses.
    pub level: LinkLevel,
}

impl Collective {
    /// Nothing to send: one rank, or no bytes.
    fn free(level: LinkLevel) -> Collective {
        Collective {
            us: 0.0,
            latency_us: 0.0,
            algorithm: Algorithm::None,
            level,
        }
    }
}

/// Costs of messages and collectives on a cluster.
#[derive(Clone, Copy, Debug)]
pub struct Comm<'a> {
    cluster: &'a Cluster,
}

impl<'a> Comm<'a> {
    /// Communication on `cluster`.
    pub fn new(cluster: &'a Cluster) -> Comm<'a> {
        Comm { cluster }
    }

    /// A message from one rank to another, µs (free on the same rank).
    pub fn send_us(&self, from: u32, to: u32, bytes: f64) -> f64 {
        if from == to || bytes <= 0.0 {
            return 0.0;
        }
        p2p_us(self.cluster.link(from, to), bytes)
    }

    /// The slowest link between consecutive ranks of a ring over `ranks` (in rank order).
    fn ring_link(&self, ranks: &[u32]) -> Link {
        let mut sorted = ranks.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let mut link = self.cluster.link(sorted[0], sorted[sorted.len() - 1]);
        for pair in sorted.windows(2) {
            link = link.worst(self.cluster.link(pair[0], pair[1]));
        }
        link
    }

    /// Ranks per node, in node order.
    fn by_node(&self, ranks: &[u32]) -> Vec<Vec<u32>> {
        let mut nodes: std::collections::BTreeMap<u32, Vec<u32>> = Default::default();
        for &r in ranks {
            let node = self.cluster.locate(r).map_or(u32::MAX, |l| l.node);
            nodes.entry(node).or_default().push(r);
        }
        nodes.into_values().collect()
    }

    /// All-reduce of `bytes` over `ranks`: the faster of a flat ring and the hierarchical
    /// algorithm (when the ranks span nodes).
    pub fn all_reduce(&self, ranks: &[u32], bytes: f64) -> Collective {
        let level = self.cluster.level(ranks);
        let n = distinct(ranks);
        if n <= 1 || bytes <= 0.0 {
            return Collective::free(level);
        }
        let link = self.ring_link(ranks);
        let ring = Collective {
            us: ring_all_reduce_us(n, link, bytes),
            latency_us: ring_all_reduce_us(n, link, 0.0),
            algorithm: Algorithm::Ring,
            level,
        };
        if self.cluster.flat.is_some() || level < LinkLevel::InterNode {
            return ring;
        }
        // Hierarchical: after the intra-node reduce-scatter each of the k local ranks
        // holds S/k and all-reduces it across nodes at the same time as the others, all
        // sharing the node's network: S/k at β_node/k each.
        let nodes = self.by_node(ranks);
        let local = nodes.iter().map(Vec::len).max().unwrap_or(1) as u32;
        let intra = nodes
            .iter()
            .filter(|n| n.len() > 1)
            .map(|n| self.cluster.link(n[0], n[1]))
            .reduce(Link::worst);
        let heads: Vec<u32> = nodes.iter().map(|n| n[0]).collect();
        let inter = self.ring_link(&heads);
        let inside = |bytes| intra.map_or(0.0, |l| 2.0 * ring_all_gather_us(local, l, bytes));
        let across = |bytes| ring_all_reduce_us(heads.len() as u32, inter, bytes);
        let hierarchical = Collective {
            us: inside(bytes) + across(bytes),
            latency_us: inside(0.0) + across(0.0),
            algorithm: Algorithm::Hierarchical,
            level,
        };
        if hierarchical.us < ring.us {
            hierarchical
        } else {
            ring
        }
    }

    /// All-gather producing `bytes` on every rank (a ring at the slowest link).
    pub fn all_gather(&self, ranks: &[u32], bytes: f64) -> Collective {
        let level = self.cluster.level(ranks);
        let n = distinct(ranks);
        if n <= 1 || bytes <= 0.0 {
            return Collective::free(level);
        }
        let link = self.ring_link(ranks);
        Collective {
            us: ring_all_gather_us(n, link, bytes),
            latency_us: ring_all_gather_us(n, link, 0.0),
            algorithm: Algorithm::Ring,
            level,
        }
    }

    /// Reduce-scatter of `bytes` (the same cost as an all-gather of them).
    pub fn reduce_scatter(&self, ranks: &[u32], bytes: f64) -> Collective {
        self.all_gather(ranks, bytes)
    }
}

fn distinct(ranks: &[u32]) -> u32 {
    let mut r = ranks.to_vec();
    r.sort_unstable();
    r.dedup();
    r.len() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINK: Link = Link {
        latency_us: 10.0,
        bandwidth: 1e9,
    };

    #[test]
    fn formulas_match_hand_computed_values() {
        // 1 MB at 1 GB/s = 1000 µs.
        assert_eq!(p2p_us(LINK, 1e6), 1010.0);
        // n = 4: 2·3·10 + 2·3/4 · 1000 = 60 + 1500.
        assert_eq!(ring_all_reduce_us(4, LINK, 1e6), 1560.0);
        // n = 4: 3·10 + 3/4 · 1000 = 30 + 750.
        assert_eq!(ring_all_gather_us(4, LINK, 1e6), 780.0);
        assert_eq!(ring_all_reduce_us(1, LINK, 1e6), 0.0);
    }

    #[test]
    fn link_class_follows_placement() {
        let c = Cluster::preset("dgx-a100x2").unwrap();
        let comm = Comm::new(&c);
        let mb = 100e6;
        let inside = comm.all_reduce(&[0, 1, 2, 3], mb);
        assert_eq!(inside.level, LinkLevel::IntraNode);
        assert_eq!(inside.algorithm, Algorithm::Ring);
        // 2·3·3.4 + 1.5 · 100e6 / 300e9 s
        assert!((inside.us - (20.4 + 500.0)).abs() < 1e-9, "{}", inside.us);
        let across = comm.all_reduce(&[0, 8], mb);
        assert_eq!(across.level, LinkLevel::InterNode);
        // One rank per node: 2·1·9.6 + 1 · 100e6 / 200e9 s
        assert!((across.us - (19.2 + 500.0)).abs() < 1e-9, "{}", across.us);
        let all: Vec<u32> = (0..16).collect();
        let both = comm.all_reduce(&all, mb);
        assert_eq!(both.algorithm, Algorithm::Hierarchical);
        // Inside: 2 × (7·3.4 + 7/8 · 333.33); across: 2·9.6 + 500.
        let expected = 2.0 * (7.0 * 3.4 + 7.0 / 8.0 * 1e8 / 300e9 * 1e6) + 19.2 + 500.0;
        assert!(
            (both.us - expected).abs() < 1e-6,
            "{} vs {expected}",
            both.us
        );
        assert_eq!(comm.send_us(3, 3, mb), 0.0);
        assert_eq!(comm.all_gather(&[5], mb).us, 0.0);
    }

    #[test]
    fn flat_network_uses_one_ring() {
        let c = Cluster::preset("dgx-a100x2")
            .unwrap()
            .with_flat_network(LINK);
        let all: Vec<u32> = (0..16).collect();
        let r = Comm::new(&c).all_reduce(&all, 1e6);
        assert_eq!(r.algorithm, Algorithm::Ring);
        assert_eq!(r.us, ring_all_reduce_us(16, LINK, 1e6));
    }
}
