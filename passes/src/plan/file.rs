//! Strategy files (`ralpc-strategy/1`, JSON): a placement written by `--write-strategy`,
//! by hand, or transcribed from another planner's published plan, evaluated with
//! `--strategy-file` under ralpc's costs.
//!
//! ```json
//! {
//!   "format": "ralpc-strategy/1",
//!   "schedule": "1f1b",
//!   "microbatches": 1,
//!   "stages": [
//!     { "first_layer": "conv1_1", "last_layer": "fc8", "replicas": 8 }
//!   ],
//!   "layers": [
//!     { "name": "fc6", "gpus": 1 },
//!     { "name": "fc7", "split": { "sample": 1, "attribute": 1, "parameter": 8 } }
//!   ]
//! }
//! ```
//!
//! * `stages` cover the layers in order; each runs on `replicas` GPUs of its own, stage
//!   after stage from rank 0, or from its `first_rank` when it gives one (a plan on one
//!   GPU type's ranks of a mixed cluster).
//! * `layers` is optional and may list any subset: a layer not listed is replicated over its
//!   stage (samples split `replicas` ways). `gpus` alone splits samples; `split` gives
//!   SOAP degrees (`attribute`: a convolution's rows or a dense layer's input features;
//!   `parameter`: output channels or features) and `gpus`, when also given, must equal
//!   their product.
//! * `schedule` (`1f1b`, `gpipe`, `async`, `zb-h1`) and `microbatches` default to `1f1b`
//!   and 1.
//! * `zero` (default 0): 1 shards the optimizer state over each replica group (ZeRO-1),
//!   2 the gradients too, 3 the weights too (FSDP).
//! * `recompute` (default none): runs of layers whose activations are recomputed, each
//!   `{ "first_layer": …, "last_layer": … }` inside one stage.
//!
//! Layers are named as `ralpc plan --json` names them (the ONNX node name of a layer's main
//! op, or PipeDream's node id).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{PlanError, Schedule, Stage, Strategy};
use crate::layers::{LayerGraph, Split};

/// The most GPUs one layer's split may use (a cluster file's own limit).
const MAX_SPLIT_GPUS: u32 = 1_000_000;
/// The format tag.
pub const FORMAT: &str = "ralpc-strategy/1";

/// A strategy file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StrategyFile {
    /// Always [`FORMAT`].
    pub format: String,
    /// The schedule.
    #[serde(default = "default_schedule")]
    pub schedule: Schedule,
    /// Microbatches per iteration.
    #[serde(default = "one")]
    pub microbatches: u32,
    /// The stages.
    pub stages: Vec<StrategyFileStage>,
    /// Per-layer placements (any subset).
    #[serde(default)]
    pub layers: Vec<StrategyFileLayer>,
    /// ZeRO stage: 0 or 1.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub zero: u8,
    /// Under ZeRO, the groups each replica group is cut into, each sharding a whole copy
    /// of the state (hybrid sharding; 1: none).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub shard_groups: u32,
    /// Runs of layers whose activations are recomputed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recompute: Vec<StrategyFileRun>,
    /// Virtual stages per GPU (the interleaved schedule): the stages are taken in turns
    /// by the GPUs of the first `stages / virtual_stages`, stage `k` on stage
    /// `k mod (stages / virtual_stages)`'s.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub virtual_stages: u32,
}

fn is_zero(v: &u8) -> bool {
    *v == 0
}

fn is_one(v: &u32) -> bool {
    *v == 1
}

/// A run of recomputed layers in a strategy file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StrategyFileRun {
    /// Name of its first layer.
    pub first_layer: String,
    /// Name of its last layer.
    pub last_layer: String,
}

fn default_schedule() -> Schedule {
    Schedule::OneFOneB
}

fn one() -> u32 {
    1
}

/// A stage in a strategy file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StrategyFileStage {
    /// Name of its first layer.
    pub first_layer: String,
    /// Name of its last layer.
    pub last_layer: String,
    /// Its GPUs.
    pub replicas: u32,
    /// Its first rank (default: the rank after the stage before's, 0 for the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_rank: Option<u32>,
}

/// A layer's placement in a strategy file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StrategyFileLayer {
    /// The layer.
    pub name: String,
    /// The PyTorch module it came from, when the export says (written for readers and for
    /// `ralpc.torch`; a layer may also be named by it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    /// What kind of work it does (written for readers and for `ralpc.torch`; ignored when
    /// read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<crate::layers::LayerKind>,
    /// The layers whose outputs it reads (written for readers and for `ralpc.torch`, which
    /// keeps a split output split only where every reader takes it so; ignored when read).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<String>,
    /// GPUs it uses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
    /// Its SOAP degrees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<FileSplit>,
}

/// SOAP degrees in a file (each defaults to 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileSplit {
    /// Sample degree.
    #[serde(default = "one")]
    pub sample: u32,
    /// Context degree: each sample's sequence in this many pieces (context parallelism).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub context: u32,
    /// Attribute degree.
    #[serde(default = "one")]
    pub attribute: u32,
    /// Parameter degree.
    #[serde(default = "one")]
    pub parameter: u32,
}

impl StrategyFile {
    /// Parses a strategy file's text.
    ///
    /// # Errors
    /// Malformed JSON, an unknown field or a wrong format tag, naming the place.
    pub fn parse(text: &str) -> Result<StrategyFile, PlanError> {
        let file: StrategyFile = serde_json::from_str(text)
            .map_err(|e| PlanError::Strategy(format!("not a strategy file: {e}")))?;
        if file.format != FORMAT {
            return Err(PlanError::Strategy(format!(
                "format is \"{}\"; this ralpc reads \"{FORMAT}\"",
                file.format
            )));
        }
        Ok(file)
    }

    /// The file form of `strategy`: every layer listed with its GPUs and split.
    pub fn of(graph: &LayerGraph, strategy: &Strategy) -> StrategyFile {
        let name = |i: usize| graph.layers[i].name.clone();
        // A stage's first rank is written where it is not the one the file would give it.
        let devices = strategy.stages.len() / strategy.virtual_stages().max(1);
        let mut next = 0u32;
        StrategyFile {
            format: FORMAT.to_owned(),
            schedule: strategy.schedule,
            microbatches: strategy.microbatches,
            stages: strategy
                .stages
                .iter()
                .enumerate()
                .map(|(k, s)| {
                    let implied = k >= devices || s.first_rank == next;
                    if k < devices {
                        next = s.first_rank.saturating_add(s.gpus);
                    }
                    StrategyFileStage {
                        first_layer: name(s.first_layer),
                        last_layer: name(s.last_layer),
                        replicas: s.gpus,
                        first_rank: (!implied).then_some(s.first_rank),
                    }
                })
                .collect(),
            layers: strategy
                .layers
                .iter()
                .enumerate()
                .map(|(i, s)| StrategyFileLayer {
                    name: name(i),
                    module: Some(graph.layers[i].module.clone()).filter(|m| !m.is_empty()),
                    kind: Some(graph.layers[i].kind),
                    inputs: graph.layers[i]
                        .inputs
                        .iter()
                        .filter_map(|edge| match edge.from {
                            crate::layers::Producer::Layer(from) => {
                                graph.layers.get(from.0 as usize).map(|l| l.name.clone())
                            }
                            crate::layers::Producer::Input(_) => None,
                        })
                        .collect(),
                    gpus: Some(s.degree()),
                    split: Some(FileSplit {
                        sample: s.sample,
                        context: s.context,
                        attribute: s.attribute,
                        parameter: s.parameter,
                    }),
                })
                .collect(),
            zero: strategy.zero,
            shard_groups: strategy.shard_groups,
            recompute: strategy
                .recompute
                .iter()
                .map(|&(first, last)| StrategyFileRun {
                    first_layer: name(first),
                    last_layer: name(last),
                })
                .collect(),
            virtual_stages: strategy.virtual_stages() as u32,
        }
    }

    /// Pretty JSON with a trailing newline.
    pub fn to_json(&self) -> String {
        // Plain strings and integers always serialize.
        serde_json::to_string_pretty(self).unwrap_or_default() + "\n"
    }

    /// The strategy this file describes for `graph`.
    ///
    /// # Errors
    /// An unknown or ambiguous layer name, stages out of order, a layer listed twice, or
    /// `gpus` disagreeing with `split`.
    pub fn resolve(&self, graph: &LayerGraph) -> Result<Strategy, PlanError> {
        let bad = |m: String| PlanError::Strategy(m);
        // A layer is named by its own name or, failing that, by its PyTorch module's path.
        let mut index: BTreeMap<&str, Option<usize>> = BTreeMap::new();
        let mut modules: BTreeMap<&str, Option<usize>> = BTreeMap::new();
        for (i, l) in graph.layers.iter().enumerate() {
            index
                .entry(l.name.as_str())
                .and_modify(|e| *e = None)
                .or_insert(Some(i));
            if !l.module.is_empty() {
                modules
                    .entry(l.module.as_str())
                    .and_modify(|e| *e = None)
                    .or_insert(Some(i));
            }
        }
        let find = |field: &str, name: &str| -> Result<usize, PlanError> {
            match index.get(name).or_else(|| modules.get(name)) {
                Some(Some(i)) => Ok(*i),
                Some(None) => Err(bad(format!(
                    "{field}: \"{name}\" names several layers (name them by layer)"
                ))),
                None => Err(bad(format!(
                    "{field}: no layer or module is named \"{name}\""
                ))),
            }
        };
        let mut stages: Vec<Stage> = Vec::with_capacity(self.stages.len());
        let v = self.virtual_stages.max(1) as usize;
        if self.stages.len() % v != 0 {
            return Err(bad(format!(
                "virtual_stages is {v}; the {} stages do not take turns on {v} per GPU",
                self.stages.len()
            )));
        }
        if self.schedule == super::Schedule::ZeroBubbleV && v != 2 {
            return Err(bad(format!(
                "schedule zb-v runs two stages on each GPU (a V): virtual_stages must be 2, \
                 not {v}"
            )));
        }
        let devices = self.stages.len() / v;
        let mut rank = 0u32;
        for (k, s) in self.stages.iter().enumerate() {
            let first = find(&format!("stages[{k}].first_layer"), &s.first_layer)?;
            let last = find(&format!("stages[{k}].last_layer"), &s.last_layer)?;
            if s.replicas == 0 {
                return Err(bad(format!("stages[{k}].replicas must be ≥ 1")));
            }
            // A later virtual stage runs on its turn's GPUs again (its group's first
            // stage's: the V's way back under zb-v); a stage of its own starts after the
            // one before (at its `first_rank`, when given).
            let group = match k >= devices && devices > 0 {
                true => Some(super::order::group_of_stage(self.schedule, devices, k).0),
                false => None,
            };
            let earlier = group.map(|j| stages[j]);
            match (s.first_rank, earlier) {
                (Some(r), Some(e)) if r != e.first_rank => {
                    return Err(bad(format!(
                        "stages[{k}].first_rank is {r}; as a virtual stage on stage {}'s GPUs \
                         it starts at rank {}",
                        group.unwrap_or(0),
                        e.first_rank
                    )))
                }
                (Some(r), None) if r < rank => {
                    return Err(bad(format!(
                        "stages[{k}].first_rank is {r}, among the ranks of the stages before \
                         it (from rank {rank} on); stages sharing GPUs are virtual stages \
                         (virtual_stages)"
                    )))
                }
                _ => {}
            }
            let first_rank = match earlier {
                Some(earlier) if earlier.gpus == s.replicas => earlier.first_rank,
                Some(earlier) => {
                    return Err(bad(format!(
                        "stages[{k}].replicas is {}; as a virtual stage on stage {}'s GPUs it \
                         needs {}",
                        s.replicas,
                        group.unwrap_or(0),
                        earlier.gpus
                    )))
                }
                None => s.first_rank.unwrap_or(rank),
            };
            stages.push(Stage {
                first_layer: first,
                last_layer: last,
                first_rank,
                gpus: s.replicas,
            });
            if k < devices {
                rank = first_rank.saturating_add(s.replicas);
            }
        }
        let mut layers: Vec<Option<Split>> = vec![None; graph.layers.len()];
        for (i, l) in self.layers.iter().enumerate() {
            let at = find(&format!("layers[{i}].name"), &l.name)?;
            if layers[at].is_some() {
                return Err(bad(format!(
                    "layers[{i}]: layer \"{}\" is listed twice",
                    l.name
                )));
            }
            let split = match (l.gpus, l.split) {
                (_, Some(s)) => {
                    // A split uses at most a cluster's largest GPU count (and its degree,
                    // a product, must not overflow).
                    let degree = [s.sample, s.context, s.attribute, s.parameter]
                        .iter()
                        .try_fold(1u32, |d, &f| d.checked_mul(f.max(1)))
                        .filter(|&d| d <= MAX_SPLIT_GPUS);
                    if degree.is_none() {
                        return Err(bad(format!(
                            "layers[{i}] (\"{}\"): its split uses more than {MAX_SPLIT_GPUS} GPUs",
                            l.name
                        )));
                    }
                    let split = Split {
                        sample: s.sample,
                        context: s.context,
                        attribute: s.attribute,
                        parameter: s.parameter,
                    };
                    if l.gpus.is_some_and(|g| g != split.degree()) {
                        return Err(bad(format!(
                            "layers[{i}] (\"{}\"): gpus is {} but the split uses {}",
                            l.name,
                            l.gpus.unwrap_or(0),
                            split.degree()
                        )));
                    }
                    split
                }
                (Some(g), None) => Split::samples(g),
                (None, None) => {
                    return Err(bad(format!(
                        "layers[{i}] (\"{}\"): give gpus or split",
                        l.name
                    )))
                }
            };
            layers[at] = Some(split);
        }
        let stage_gpus = |l: usize| {
            stages
                .iter()
                .find(|s| s.first_layer <= l && l <= s.last_layer)
                .map_or(1, |s| s.gpus)
        };
        let recompute = self
            .recompute
            .iter()
            .enumerate()
            .map(|(i, run)| {
                Ok((
                    find(&format!("recompute[{i}].first_layer"), &run.first_layer)?,
                    find(&format!("recompute[{i}].last_layer"), &run.last_layer)?,
                ))
            })
            .collect::<Result<Vec<_>, PlanError>>()?;
        Ok(Strategy {
            zero: self.zero,
            shard_groups: self.shard_groups,
            recompute,
            schedule: self.schedule,
            microbatches: self.microbatches,
            layers: layers
                .into_iter()
                .enumerate()
                .map(|(l, s)| s.unwrap_or_else(|| Split::samples(stage_gpus(l))))
                .collect(),
            stages,
        })
    }
}
