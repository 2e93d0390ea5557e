//! Memory per GPU: weights, gradients, optimizer state, stashed activations, workspace.

use serde::{Deserialize, Serialize};

/// The optimizer, which sets the state kept per parameter.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Optimizer {
    /// Plain SGD: no state.
    Sgd,
    /// SGD with momentum: one buffer.
    #[default]
    Momentum,
    /// Adam: two moments.
    Adam,
}

impl Optimizer {
    /// State bytes per parameter byte.
    pub fn state_factor(self) -> f64 {
        match self {
            Optimizer::Sgd => 0.0,
            Optimizer::Momentum => 1.0,
            Optimizer::Adam => 2.0,
        }
    }

    /// Parses `sgd`, `momentum`, `adam`.
    pub fn parse(name: &str) -> Option<Optimizer> {
        Some(match name {
            "sgd" => Optimizer::Sgd,
            "momentum" => Optimizer::Momentum,
            "adam" => Optimizer::Adam,
            _ => return None,
        })
    }
}

/// Bytes reserved on every GPU for the CUDA context and library workspaces (cuDNN, cuBLAS,
/// NCCL buffers): 1 GiB, a round figure of what PyTorch processes hold before any tensor.
pub const DEFAULT_WORKSPACE_BYTES: f64 = (1u64 << 30) as f64;

/// One GPU's memory, bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct MemoryUse {
    /// Its weights.
    pub weights: f64,
    /// Their gradients.
    pub gradients: f64,
    /// Optimizer state.
    pub optimizer_state: f64,
    /// Activations kept for backward (× in-flight microbatches).
    pub activations: f64,
    /// Context and workspaces.
    pub workspace: f64,
}

impl MemoryUse {
    /// Weights, gradients and optimizer state of `param_bytes` of parameters, plus
    /// `stash_bytes` of activations for each of `in_flight` microbatches.
    pub fn new(
        param_bytes: f64,
        stash_bytes: f64,
        in_flight: u32,
        optimizer: Optimizer,
        workspace: f64,
    ) -> MemoryUse {
        MemoryUse {
            weights: param_bytes,
            gradients: param_bytes,
            optimizer_state: param_bytes * optimizer.state_factor(),
            activations: stash_bytes * f64::from(in_flight.max(1)),
            workspace,
        }
    }

    /// The sum.
    pub fn total(&self) -> f64 {
        self.weights + self.gradients + self.optimizer_state + self.activations + self.workspace
    }

    /// Whether it fits in `capacity` bytes.
    pub fn fits(&self, capacity: u64) -> bool {
        self.total() <= capacity as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adam_keeps_two_moments() {
        let m = MemoryUse::new(100.0, 10.0, 4, Optimizer::Adam, 1.0);
        assert_eq!(m.optimizer_state, 200.0);
        assert_eq!(m.activations, 40.0);
        // 100 weights + 100 gradients + 200 state + 40 activations + 1 workspace.
        assert_eq!(m.total(), 441.0);
        assert!(m.fits(441) && !m.fits(440));
        assert_eq!(
            MemoryUse::new(100.0, 0.0, 1, Optimizer::Sgd, 0.0).total(),
            200.0
        );
        assert_eq!(
            MemoryUse::new(100.0, 0.0, 1, Optimizer::Momentum, 0.0).total(),
            300.0
        );
    }
}
