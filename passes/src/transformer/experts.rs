//! Mixtures of experts as Megatron-Core runs them: how tokens reach their experts, the load
//! imbalance, and the price of a block's experts — the router over each rank's positions,
//! dispatch and combine as all-to-alls on the topology, grouped GEMMs at each local
//! expert's rows, shared experts beside them.

use ralpc_ir::models::MoeSpec;
use serde::Serialize;

use crate::cluster::Cluster;
use crate::cost::comm::ring_all_gather_us;

use super::estimate::{per_gpu_link, Mlp};
use super::kernels::Kernels;
use super::{Parallelism, Transformer};

/// A mixture of experts' load imbalance where none is given: the lower end of the
/// inter-rank imbalance (busiest expert-parallel rank's tokens over the mean) measured in
/// training and prefill of 106–671 B mixtures of experts without expert rebalancing, 1.30
/// to 4.01 (Wei et al., "UltraEP", arXiv:2606.04101, abstract). Megatron-Bridge's
/// published benchmarks force balanced routing: 1.
pub const DEFAULT_EXPERT_IMBALANCE: f64 = 1.3;

/// Host time a mixture-of-experts layer leaves the GPU idle per microbatch, µs, on the
/// forward (and again in a full recomputation's forward), beyond the launches priced kernel by
/// kernel. Megatron-Core stops the host at every MoE layer until the GPU has caught up (the
/// `alltoall` dispatcher copies the token counts to the host before its all-to-all, "A
/// synchronization is needed before expert parallel AlltoAll communication to get the
/// `input_splits` and `output_splits` CPU values", `transformer/moe/token_dispatcher.py`;
/// DeepEP's dispatch waits for the GPU's signal, `fused_a2a.py`; the FP8 experts call
/// `tokens_per_expert.tolist()`, `experts.py`); the host then cannot run ahead, and its
/// Python and framework time shows. No published benchmark gives this time: it is
/// **fitted**, the one constant fitted to published runs in the mixture-of-experts price
/// (minimum mean |error| over the nine given Megatron-Bridge MoE rows on a 250 µs grid,
/// 2026-12-06, `passes/tests/anchors_bridge.rs`), so it also absorbs what else those rows
/// miss. Published runs outside them check it (`moe_prices_hold_on_runs_not_fitted`).
/// Nothing hides behind it: the dispatcher syncs before its own all-to-all.
pub const MOE_HOST_STALL_US: f64 = 4500.0;

/// How a mixture of experts runs, beyond its parallel degrees.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct ExpertOptions {
    /// The busiest expert-parallel rank's token–expert pairs over the mean (1: balanced).
    pub imbalance: f64,
    /// How tokens reach their experts.
    pub dispatcher: Dispatcher,
    /// Dispatch and combine overlapped with another microbatch's compute (Megatron-Core's
    /// `--overlap-moe-expert-parallel-comm`), where Megatron-Core runs it.
    pub a2a_overlap: bool,
    /// Each expert's capacity over its mean share of the token–expert pairs (Megatron-Core's
    /// `--moe-expert-capacity-factor`): the pairs beyond it are dropped. None: none dropped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_factor: Option<f64>,
    /// Every expert's input padded to its capacity (`--moe-pad-expert-input-to-capacity`):
    /// each computes and receives exactly its capacity.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub pad_to_capacity: bool,
}

impl Default for ExpertOptions {
    fn default() -> ExpertOptions {
        ExpertOptions {
            imbalance: DEFAULT_EXPERT_IMBALANCE,
            dispatcher: Dispatcher::AllToAll,
            a2a_overlap: false,
            capacity_factor: None,
            pad_to_capacity: false,
        }
    }
}

impl ExpertOptions {
    /// The busiest expert-parallel rank's token–expert pairs over the mean that it
    /// receives and computes: the imbalance; capped at the capacity factor where one is set
    /// (no local expert takes more than its capacity, the rest are dropped); exactly the
    /// capacity factor when inputs are padded to it (Megatron-Core's `get_capacity`:
    /// `ceil(tokens·top_k / experts · factor)` per expert).
    pub fn load(&self) -> f64 {
        match self.capacity_factor {
            None => self.imbalance,
            Some(factor) if self.pad_to_capacity => factor,
            Some(factor) => self.imbalance.min(factor),
        }
    }
}

/// How a mixture of experts' tokens are dispatched to their experts and combined back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Dispatcher {
    /// NCCL all-to-alls, one copy of a token per chosen expert (Megatron-Core's
    /// `--moe-token-dispatcher-type alltoall`).
    #[default]
    AllToAll,
    /// DeepEP's or HybridEP's kernels (Megatron-Core's `flex` dispatcher): a token crosses
    /// the network once per node holding its experts and is forwarded over NVLink inside it
    /// (DeepSeek-AI, DeepEP README: 43–58 GB/s of a 50 GB/s NIC across nodes, 153–158 GB/s
    /// of H800's 160 GB/s NVLink inside).
    Flex,
}

impl Dispatcher {
    /// Its name on the command line and in Megatron-LM's arguments.
    pub fn name(self) -> &'static str {
        match self {
            Dispatcher::AllToAll => "alltoall",
            Dispatcher::Flex => "flex",
        }
    }

    /// Parses `alltoall` or `flex`.
    pub fn parse(name: &str) -> Option<Dispatcher> {
        [Dispatcher::AllToAll, Dispatcher::Flex]
            .into_iter()
            .find(|d| d.name() == name)
    }
}

/// What pricing a mixture of experts reads.
pub(super) struct ExpertContext<'a> {
    pub(super) model: &'a Transformer,
    pub(super) moe: MoeSpec,
    pub(super) par: &'a Parallelism,
    pub(super) kernels: &'a Kernels,
    pub(super) cluster: &'a Cluster,
    /// A rank's positions in the attention (`s·b/c`).
    pub(super) tokens: f64,
    /// Sequence parallelism's split of the positions outside the attention.
    pub(super) sp: f64,
    pub(super) imbalance: f64,
    pub(super) dispatcher: Dispatcher,
}

/// A mixture of experts' half of a block (Megatron-Core's MoE layer): a router over each
/// rank's own positions, tokens permuted and dispatched to the `ep` ranks holding their
/// experts, grouped GEMMs over the local experts at the rows each receives, combine and
/// unpermute back; shared experts as a tensor-parallel dense MLP beside it.
pub(super) fn expert_mlp(
    cx: &ExpertContext<'_>,
    cast: &impl Fn(f64, f64, f64) -> (f64, f64),
    fwd_bwd: &impl Fn(f64, f64, f64, f64) -> (f64, f64),
) -> Mlp {
    let (model, moe, par, kernels) = (cx.model, cx.moe, cx.par, cx.kernels);
    let (h, e) = (model.hidden as f64, kernels.e);
    let t = f64::from(par.tensor);
    let m = model.spec().mlp_matrices() as f64;
    let (ep, etp) = (
        f64::from(par.expert.max(1)),
        f64::from(par.expert_tensor.max(1)),
    );
    let experts = moe.experts as f64;
    // Each rank routes its own positions: sequence parallelism splits them over the
    // tensor-parallel ranks (Megatron-Core refuses to train a mixture of experts with
    // tensor parallelism and without it).
    let routed = cx.tokens / cx.sp;
    // Token–expert pairs on the busiest rank: `k` a token, times the imbalance.
    let pairs = routed * moe.top_k as f64 * cx.imbalance;
    let local = experts / ep;
    let inner = moe.expert_ffn as f64 / etp;
    // Each local expert's rows: its pairs from the `etp` ranks sharing its columns.
    let rows = pairs * etp / local;
    // Grouped GEMMs: one launch over the local experts, each at its own rows, so few rows
    // an expert leave them bound by reading the weights.
    let fc1 = kernels.grouped_forward_backward(rows, (m - 1.0) * inner, h, local);
    let fc2 = kernels.grouped_forward_backward(rows, h, inner, local);
    let router = kernels.forward_backward(true, routed, experts, h, 1.0);
    let (shared, shared_elements, shared_bytes) = match moe.shared_ffn {
        0 => (vec![], (0.0, 0.0), 0.0),
        f => {
            let f = f as f64;
            (
                vec![
                    fwd_bwd(cx.tokens, (m - 1.0) * f / t, h, 1.0),
                    fwd_bwd(cx.tokens, h, f / t, 1.0),
                ],
                (cx.tokens * (h + f / t), cx.tokens * ((m - 1.0) * f / t + h)),
                m * cx.tokens * f / t * e,
            )
        }
    };
    let gathered = pairs * etp;
    let casts = cast(
        gathered * (h + inner) + shared_elements.0,
        gathered * ((m - 1.0) * inner + h) + shared_elements.1,
        2.0 + shared.len() as f64,
    );
    // Memory-bound: the LayerNorm and residual over the rank's positions, the router's
    // fp32 scores (written, read and written by its softmax and top-k), the permutation
    // (the tokens read, the pairs written) and its inverse, the activation over the pairs'
    // inner features, the shared experts' activation.
    let bytes = 2.0 * routed * h * e
        + routed * h * (3.0 * e + 1.0)
        + 3.0 * routed * experts * 4.0
        + 2.0 * (routed + pairs) * h * e
        + m * pairs * moe.expert_ffn as f64 * e
        + shared_bytes;
    let launches = 7.0 + if shared.is_empty() { 0.0 } else { 1.0 };
    // Transformer Engine's `GroupedLinear` (v2.12, in the 26.02 containers) runs the "grouped"
    // GEMM as one cuBLAS GEMM a local expert (`multi_stream_cublas_gemm`, round-robin over
    // four streams, `common/gemm/cublaslt_gemm.cu`) and quantizes each expert's rows on their
    // own (`split_quantize`, `pytorch/module/grouped_linear.py`). Beyond the one launch a
    // product the grouped GEMM above priced: a launch for every other local expert's GEMM
    // (forward: fc1, fc2; backward: their input and weight gradients), and the
    // quantizations of fc1's and fc2's inputs (forward) and output gradients (backward)
    // beyond the two launches a product `casts` priced. Weights are quantized once a step.
    let quantize = (local * kernels.quantize_launches - 2.0).max(0.0);
    let per_expert =
        |products: f64| (products * (local - 1.0) + 2.0 * quantize) * kernels.launch_us;
    let products = |pass: fn(&(f64, f64)) -> f64| {
        pass(&fc1) + pass(&fc2) + pass(&router) + shared.iter().map(pass).sum::<f64>()
    };
    // Dispatch and combine each way; with expert tensor parallelism the dispatched pairs
    // are all-gathered over the `etp` ranks and reduce-scattered back.
    let intra = cx.cluster.group_of(0).intra_node;
    let exchange = 2.0
        * (all_to_all_us(
            cx.cluster,
            (par.expert, par.expert_tensor),
            &moe,
            pairs * h * e,
            cx.dispatcher,
        ) + ring_all_gather_us(par.expert_tensor, intra, gathered * h * e));
    // Weight gradients apart (zero-bubble schedules) but for the products reading an
    // input gathered over their ranks: the experts' first under expert tensor parallelism,
    // the shared experts' first under tensor parallelism.
    let gathered = if par.expert_tensor > 1 { fc1.1 } else { 0.0 }
        + match (par.tensor > 1, shared.first()) {
            (true, Some(first)) => first.1,
            _ => 0.0,
        };
    let weight_us = (products(|g| g.1) - gathered) / 2.0;
    Mlp {
        forward_us: products(|g| g.0)
            + casts.0
            + kernels.elementwise(bytes, launches)
            + per_expert(2.0),
        backward_us: products(|g| g.1)
            + casts.1
            + 2.0 * kernels.elementwise(bytes, launches)
            + per_expert(4.0),
        beside_collectives: shared,
        exchange_us: (exchange, exchange),
        experts: true,
        activation_us: kernels.elementwise(m * pairs * moe.expert_ffn as f64 * e, 1.0),
        weight_us,
        host_us: MOE_HOST_STALL_US,
    }
}

/// The nodes of an expert-parallel group spread over `nodes` that one token's `top_k`
/// experts are on, expected, with experts picked uniformly. Group-limited routing
/// (DeepSeek-V3's node-limited routing, "each token will be sent to at most M nodes",
/// arXiv:2412.19437 §2.1.2; Megatron-Core's `--moe-router-num-groups` and
/// `--moe-router-group-topk`, whose groups are contiguous blocks of experts as expert
/// parallelism places them) picks the token's experts from `top_groups` of `groups`, so
/// fewer nodes: a node is missed when none of its groups is chosen, or none of the token's
/// experts lands in those chosen. Where groups and nodes do not nest, no limit is assumed
/// (an upper bound).
fn nodes_reached(nodes: u32, moe: &MoeSpec) -> f64 {
    let n = f64::from(nodes);
    let k = moe.top_k.max(1) as i32;
    let (g, t) = (moe.groups, moe.top_groups);
    let missed = if g <= 1 || t == 0 || t >= g {
        (1.0 - 1.0 / n).powi(k)
    } else if g % u64::from(nodes) == 0 {
        // `per` whole groups on each node: `j` of them chosen (hypergeometric), and the
        // token's experts all in the other `t − j` chosen groups.
        let per = g / u64::from(nodes);
        (0..=per.min(t))
            .map(|j| {
                choose(per, j) * choose(g - per, t - j) / choose(g, t)
                    * (1.0 - j as f64 / t as f64).powi(k)
            })
            .sum()
    } else if u64::from(nodes) % g == 0 {
        // Each group over `span` nodes: the node's group not chosen, or chosen and missed
        // among the `t · span` nodes the chosen groups cover.
        let span = u64::from(nodes) / g;
        let chosen = t as f64 / g as f64;
        (1.0 - chosen) + chosen * (1.0 - 1.0 / (t * span) as f64).powi(k)
    } else {
        (1.0 - 1.0 / n).powi(k)
    };
    n * (1.0 - missed)
}

/// `n` choose `k`, as a float (`n` up to a few hundred groups).
fn choose(n: u64, k: u64) -> f64 {
    if k > n {
        return 0.0;
    }
    (0..k).fold(1.0, |c, i| c * (n - i) as f64 / (i + 1) as f64)
}

/// One all-to-all over an expert-parallel group of `ep` ranks `stride` apart, in which
/// every rank sends `bytes` of token–expert pairs spread evenly over the group's experts,
/// µs: NVLink inside a node (or an NVLink domain), each GPU's share of its node's NICs
/// across. A [`Dispatcher::Flex`] sends a token to a remote node once however many of its
/// `top_k` experts are there ([`nodes_reached`]: with experts picked uniformly,
/// `(N − 1)(1 − (1 − 1/N)^k)` copies of a token cross the network for `N` nodes, against
/// `k(N − 1)/N`; fewer under group-limited routing).
fn all_to_all_us(
    cluster: &Cluster,
    (ep, stride): (u32, u32),
    moe: &MoeSpec,
    bytes: f64,
    dispatcher: Dispatcher,
) -> f64 {
    let k = moe.top_k.max(1) as f64;
    spread_all_to_all_us(
        cluster,
        (ep, stride),
        bytes,
        |nodes, within| match dispatcher {
            Dispatcher::AllToAll => (f64::from(ep) - within) / f64::from(ep),
            Dispatcher::Flex => {
                let nodes_f = f64::from(nodes);
                nodes_reached(nodes, moe) * (nodes_f - 1.0) / nodes_f / k
            }
        },
    )
}

/// One all-to-all over a group of `n` ranks `stride` apart in which every rank sends
/// `bytes` spread evenly over the group, µs: NVLink inside a node (or an NVLink domain),
/// each GPU's share of its node's NICs across.
pub(super) fn group_all_to_all_us(cluster: &Cluster, (n, stride): (u32, u32), bytes: f64) -> f64 {
    spread_all_to_all_us(cluster, (n, stride), bytes, |_, within| {
        (f64::from(n) - within) / f64::from(n)
    })
}

/// [`group_all_to_all_us`] with the share of `bytes` that leaves the node given by
/// `remote(nodes, members per node)`.
fn spread_all_to_all_us(
    cluster: &Cluster,
    (n, stride): (u32, u32),
    bytes: f64,
    remote: impl FnOnce(u32, f64) -> f64,
) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    let ranks = f64::from(n);
    if let Some(flat) = cluster.flat {
        return flat.latency_us + bytes * (ranks - 1.0) / ranks / flat.bandwidth * 1e6;
    }
    let group = cluster.group_of(0);
    let gpn = group.gpus_per_node.max(1);
    // Members of the group on one node.
    let local = (gpn / stride.max(1)).clamp(1, n);
    let intra = group.intra_node;
    let within = f64::from(local);
    let intra_us = intra.latency_us + bytes * (within - 1.0) / ranks / intra.bandwidth * 1e6;
    let nodes = n.div_ceil(local);
    if nodes <= 1 {
        return intra_us;
    }
    let across = per_gpu_link(cluster, 0, gpn.min(cluster.gpu_count()), gpn);
    let inter_us = across.latency_us + bytes * remote(nodes, within) / across.bandwidth * 1e6;
    intra_us.max(inter_us)
}

#[cfg(test)]
mod tests {
    use ralpc_ir::models::Router;

    use super::*;

    #[test]
    fn a_capacity_caps_the_load_and_padding_fills_it() {
        let at = |capacity_factor, pad_to_capacity| {
            ExpertOptions {
                imbalance: 1.3,
                capacity_factor,
                pad_to_capacity,
                ..ExpertOptions::default()
            }
            .load()
        };
        assert_eq!(at(None, false), 1.3);
        assert_eq!(at(Some(1.0), false), 1.0);
        assert_eq!(at(Some(2.0), false), 1.3);
        assert_eq!(at(Some(2.0), true), 2.0);
        assert_eq!(at(Some(0.5), true), 0.5);
    }

    fn moe(groups: u64, top_groups: u64) -> MoeSpec {
        MoeSpec {
            experts: 256,
            top_k: 8,
            expert_ffn: 2048,
            shared_ffn: 2048,
            dense_layers: 3,
            router: Router::Sigmoid,
            groups,
            top_groups,
        }
    }

    #[test]
    fn group_limited_routing_reaches_at_most_its_groups_nodes() {
        // Without a limit: N(1 − (1 − 1/N)^k).
        let free = nodes_reached(8, &moe(0, 0));
        assert!((free - 8.0 * (1.0 - (7.0f64 / 8.0).powi(8))).abs() < 1e-12);
        assert_eq!(nodes_reached(8, &moe(8, 8)), free);
        // DeepSeek-V3 on 8 nodes, a group a node, 4 chosen: 4(1 − (3/4)^8) nodes.
        let limited = nodes_reached(8, &moe(8, 4));
        assert!(
            (limited - 4.0 * (1.0 - 0.75f64.powi(8))).abs() < 1e-9,
            "{limited}"
        );
        assert!(limited < free && limited <= 4.0);
        // Two groups a node: at most 4 nodes still, more often spread.
        let two = nodes_reached(4, &moe(8, 4));
        assert!(two > 0.0 && two <= 4.0);
        // A group over two nodes: at most 8 of 16.
        let spread = nodes_reached(16, &moe(8, 4));
        assert!(
            spread <= 8.0 && spread < nodes_reached(16, &moe(0, 0)),
            "{spread}"
        );
        // Groups and nodes that do not nest: no limit assumed.
        assert_eq!(nodes_reached(3, &moe(8, 4)), nodes_reached(3, &moe(0, 0)));
    }
}
