//! The planner's file readers as functions of bytes, for fuzzers and their corpus replay:
//! profiles (ralpc JSON, PipeDream `graph.txt`, DeepPool `.prof`), cluster files (TOML)
//! and strategy files. Every one may fail; none may panic. A profile that reads is also
//! looked up, and a cluster that reads is described and written back, so the fuzzer
//! reaches the code that uses what was read.

use crate::cluster::Cluster;
use crate::plan::StrategyFile;
use crate::profile::{self, Loaded};

/// Reads `bytes` as any profile format, then uses what it read.
pub fn profile(bytes: &[u8]) {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    match profile::parse(text, "fuzzed") {
        Ok(Loaded::Profile(p)) => {
            for e in &p.entries {
                for batch in [0.5, 1.0, 3.0, 1e9] {
                    let _ = p.lookup(&e.signature, batch);
                }
            }
        }
        Ok(Loaded::LayerGraph(g)) => {
            let _ = g.graph.total_flops();
            let _ = g.graph.param_bytes();
        }
        Err(_) => {}
    }
}

/// Reads `bytes` as a cluster file, then describes it and writes it back.
pub fn cluster(bytes: &[u8]) {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    if let Ok(c) = Cluster::from_toml(text, "fuzzed.toml") {
        let _ = c.describe();
        let _ = c.to_toml();
        let n = c.gpu_count();
        for r in 0..n.min(64) {
            let _ = c.link(0, r);
        }
    }
}

/// Reads `bytes` as a strategy file.
pub fn strategy(bytes: &[u8]) {
    if let Ok(text) = std::str::from_utf8(bytes) {
        if let Ok(file) = StrategyFile::parse(text) {
            let _ = file.to_json();
        }
    }
}
