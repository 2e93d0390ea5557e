//! A background job in the foreground's idle GPU capacity, as DeepPool multiplexes GPUs.
//!
//! DeepPool (Park et al., MLSys'22; its runtime, `csrc/taskManager.cpp` of
//! seojinpark/DeepPool @ 7922cac) trains a one-GPU job on a low-priority CUDA stream
//! beside a strong-scaled foreground job, replaying it back to back from a CUDA graph: the
//! GPU's block scheduler gives the foreground's kernels the SMs first, and the background's
//! take whatever is left. What is left has two parts, both read off the foreground's
//! simulated iteration:
//! * the time nothing of the foreground runs on a GPU: waiting on another pipeline stage
//!   or another rank's message, or holding none of a layer that runs on fewer GPUs (burst
//!   parallelism's narrow layers); a collective's time is not counted (its kernels hold
//!   SMs and memory bandwidth too);
//! * the SMs a pass leaves empty: a layer split over `n` GPUs runs each piece at a small
//!   batch, slower than `1/n` of the whole pass on one GPU; the difference is capacity the
//!   one-GPU pass would have used ([`spare_compute_us`]).
//!
//! The background runs at its own one-GPU speed in all of it. What it costs the foreground
//! (kernels waiting for background blocks to drain, caches and memory bandwidth shared) is
//! the `interference` factor, a slowdown of the foreground's iteration wherever a GPU hosts
//! the background.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::{Instruction, Plan, Simulation};

/// A one-GPU training job to run in spare capacity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BackgroundJob {
    /// One iteration on a GPU of its own, µs.
    pub iteration_us: f64,
    /// Samples per iteration.
    pub batch: u64,
    /// The most memory it holds at once, bytes.
    pub memory_bytes: u64,
}

impl BackgroundJob {
    /// The job as its simulated one-GPU plan runs it.
    pub fn of(simulation: &Simulation, batch: u64) -> BackgroundJob {
        BackgroundJob {
            iteration_us: simulation.iteration_time_us,
            batch,
            memory_bytes: simulation
                .ranks
                .iter()
                .map(|r| r.peak_memory_bytes)
                .max()
                .unwrap_or(0),
        }
    }

    /// Samples per second on a GPU of its own.
    pub fn alone_samples_per_second(&self) -> f64 {
        per_second(self.batch as f64, self.iteration_us)
    }
}

/// Why a GPU runs none of the background job.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Excluded {
    /// The foreground's peak and the background's together exceed the GPU's memory.
    Memory {
        /// Both, bytes.
        needed_bytes: u64,
        /// The GPU's, bytes.
        capacity_bytes: u64,
    },
}

/// One GPU's share of the background job.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct GpuShare {
    /// The foreground's rank on this GPU.
    pub rank: u32,
    /// Time nothing of the foreground runs on it per foreground iteration, µs (all of it on
    /// a GPU the foreground leaves unused).
    pub idle_us: f64,
    /// Time its passes leave SMs empty per foreground iteration ([`spare_compute_us`]), µs.
    pub spare_us: f64,
    /// The fraction of the GPU the background gets.
    pub gpu_fraction: f64,
    /// Background iterations per foreground iteration on this GPU.
    pub iterations_per_foreground_iteration: f64,
    /// Background samples per second on this GPU.
    pub samples_per_second: f64,
    /// Why the GPU runs none, where it does not.
    pub excluded: Option<Excluded>,
}

/// The foreground's spare GPU capacity filled with a background job.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct Filled {
    /// The foreground's iteration with the background beside it, µs.
    pub foreground_iteration_us: f64,
    /// Its slowdown from running alone (the interference factor where any GPU hosts the
    /// background, else 0).
    pub foreground_slowdown: f64,
    /// Every GPU's share.
    pub gpus: Vec<GpuShare>,
    /// Background samples per second on all GPUs together.
    pub samples_per_second: f64,
    /// The same as GPUs' worth of the background running alone.
    pub gpu_equivalents: f64,
}

/// Each rank's time, per iteration of `plan` as `simulation` ran it, that its layer
/// passes take beyond their share of the same passes on one GPU of its type, µs.
///
/// A pass (layer, direction, microbatch) run by `n` ranks shares `one_gpu(layer, rank)`'s
/// time — (forward, backward, the backward's weight-gradient part) of the layer on one
/// GPU, per microbatch — equally among them; a recomputation is a forward again; where a
/// rank's program splits a backward into input and weight gradients (zero-bubble
/// schedules), each part shares its part. Optimizer steps and collectives are not passes:
/// a step is the same work on one GPU, and a collective's SMs are not counted spare.
pub fn spare_compute_us(
    plan: &Plan,
    simulation: &Simulation,
    one_gpu: impl Fn(u32, u32) -> (f64, f64, f64),
) -> Vec<f64> {
    #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
    enum Pass {
        Forward,
        Backward,
        Weight,
    }
    let pass = |i: &Instruction| match *i {
        Instruction::Forward {
            layer, microbatch, ..
        }
        | Instruction::Recompute {
            layer, microbatch, ..
        } => Some((layer, Pass::Forward, microbatch)),
        Instruction::Backward {
            layer, microbatch, ..
        } => Some((layer, Pass::Backward, microbatch)),
        Instruction::WeightGradient {
            layer, microbatch, ..
        } => Some((layer, Pass::Weight, microbatch)),
        _ => None,
    };
    // How many ranks share each pass (a recomputation is its forward's rank again).
    let mut sharing: BTreeMap<(u32, Pass, u32), BTreeSet<usize>> = BTreeMap::new();
    for (rank, program) in plan.programs.iter().enumerate() {
        for key in program.iter().filter_map(pass) {
            sharing.entry(key).or_default().insert(rank);
        }
    }
    simulation
        .ranks
        .iter()
        .enumerate()
        .map(|(rank, timeline)| {
            let Some(program) = plan.programs.get(rank) else {
                return 0.0;
            };
            let split: BTreeSet<u32> = program
                .iter()
                .filter_map(pass)
                .filter(|&(_, p, _)| p == Pass::Weight)
                .map(|(l, _, _)| l)
                .collect();
            timeline
                .spans
                .iter()
                .filter_map(|span| {
                    let (layer, kind, mb) = pass(program.get(span.index)?)?;
                    let (fwd, bwd, weight) = one_gpu(layer, rank as u32);
                    let whole = match kind {
                        Pass::Forward => fwd,
                        Pass::Backward if split.contains(&layer) => bwd - weight,
                        Pass::Backward => bwd,
                        Pass::Weight => weight,
                    };
                    let n = sharing.get(&(layer, kind, mb)).map_or(1, BTreeSet::len);
                    Some((span.end_us - span.start_us - whole / n as f64).max(0.0))
                })
                .sum()
        })
        .collect()
}

/// `job` in the spare capacity of every GPU of the foreground's simulated iteration: the
/// time nothing of the foreground runs on it (neither compute nor communication: a
/// collective's kernels hold SMs too) and `spare_us` of its passes (per rank, from
/// [`spare_compute_us`]); `capacity_bytes` of memory each, of which `shared_bytes` (the
/// kernels' workspace) both jobs share, one process running both as DeepPool's runtime
/// does; the foreground slowed by `interference` (≥ 0) where a GPU it computes on hosts the
/// background. Of `gpus` GPUs, those the foreground leaves unused (past its ranks, or
/// ranks with nothing to run) run the background alone.
pub fn fill(
    gpus: u32,
    foreground: &Simulation,
    spare_us: &[f64],
    job: &BackgroundJob,
    memory: (u64, u64),
    interference: f64,
) -> Filled {
    let (capacity_bytes, shared_bytes) = memory;
    let stretch = 1.0 + interference.max(0.0);
    let alone = foreground.iteration_time_us;
    let mut gpus: Vec<GpuShare> = (0..gpus.max(foreground.ranks.len() as u32))
        .map(|rank| {
            let timeline = foreground
                .ranks
                .get(rank as usize)
                .filter(|t| !t.spans.is_empty());
            let peak = timeline.map_or(0, |t| t.peak_memory_bytes);
            let shared = shared_bytes.min(peak).min(job.memory_bytes);
            let needed = peak.saturating_add(job.memory_bytes) - shared;
            let excluded = (needed > capacity_bytes).then_some(Excluded::Memory {
                needed_bytes: needed,
                capacity_bytes,
            });
            let idle = timeline.map_or(alone, |t| t.idle_us.max(0.0));
            let spare = spare_us.get(rank as usize).copied().unwrap_or(0.0);
            let fraction = if alone > 0.0 && excluded.is_none() {
                ((idle + spare) / alone).min(1.0)
            } else {
                0.0
            };
            // What rounding leaves of a GPU the plan keeps busy is no room.
            let fraction = if fraction < 1e-9 { 0.0 } else { fraction };
            GpuShare {
                rank,
                idle_us: idle,
                spare_us: spare,
                gpu_fraction: fraction,
                // Set below once the foreground's iteration (slowed or not) is known.
                iterations_per_foreground_iteration: 0.0,
                samples_per_second: fraction * job.alone_samples_per_second(),
                excluded,
            }
        })
        .collect();
    // Only a GPU the foreground computes on can slow it.
    let used = |rank: u32| {
        foreground
            .ranks
            .get(rank as usize)
            .is_some_and(|t| !t.spans.is_empty())
    };
    let hosting = gpus.iter().any(|g| g.gpu_fraction > 0.0 && used(g.rank));
    let (iteration, slowdown) = if hosting {
        (alone * stretch, stretch - 1.0)
    } else {
        (alone, 0.0)
    };
    for g in &mut gpus {
        if hosting {
            // The foreground's iteration is longer; the capacity it leaves grows with it.
            g.idle_us *= stretch;
            g.spare_us *= stretch;
        }
        if job.iteration_us > 0.0 {
            g.iterations_per_foreground_iteration = g.gpu_fraction * iteration / job.iteration_us;
        }
    }
    let samples_per_second: f64 = gpus.iter().map(|g| g.samples_per_second).sum();
    let one = job.alone_samples_per_second();
    Filled {
        foreground_iteration_us: iteration,
        foreground_slowdown: slowdown,
        gpus,
        samples_per_second,
        gpu_equivalents: if one > 0.0 {
            samples_per_second / one
        } else {
            0.0
        },
    }
}

/// `samples` per iteration of `iteration_us` as samples per second (0 for no iteration).
pub fn per_second(samples: f64, iteration_us: f64) -> f64 {
    if iteration_us > 0.0 {
        samples * 1e6 / iteration_us
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{RankTimeline, Span, Stream};

    /// A rank busy `compute_us` of every `iteration_us` with nothing else, holding
    /// `peak` bytes.
    fn rank(compute_us: f64, iteration_us: f64, peak: u64) -> RankTimeline {
        let spans = (compute_us > 0.0)
            .then_some(Span {
                index: 0,
                stream: Stream::Compute,
                start_us: 0.0,
                end_us: compute_us,
            })
            .into_iter()
            .collect::<Vec<_>>();
        let used = !spans.is_empty();
        RankTimeline {
            spans,
            compute_us,
            communication_us: 0.0,
            busy_us: compute_us,
            idle_us: if used { iteration_us - compute_us } else { 0.0 },
            idle_windows: Vec::new(),
            finish_us: compute_us,
            peak_memory_bytes: peak,
        }
    }

    fn simulation(ranks: Vec<RankTimeline>, iteration_us: f64) -> Simulation {
        Simulation {
            iteration_time_us: iteration_us,
            samples_per_second: 0.0,
            ranks,
            bytes_sent: 0,
            bytes_by_link: Default::default(),
            gpu_time_us: 0.0,
            gpu_sec_amplification: 1.0,
        }
    }

    const JOB: BackgroundJob = BackgroundJob {
        iteration_us: 50.0,
        batch: 10,
        memory_bytes: 30,
    };

    #[test]
    fn the_background_gets_idle_and_spare_time_and_unused_gpus_whole() {
        // Rank 0 computes 60 of 100 µs, 10 of them spare; rank 1 does nothing; a third
        // GPU is past the plan's ranks.
        let sim = simulation(vec![rank(60.0, 100.0, 50), rank(0.0, 100.0, 0)], 100.0);
        let f = fill(3, &sim, &[10.0, 0.0], &JOB, (100, 0), 0.0);
        let fractions: Vec<f64> = f.gpus.iter().map(|g| g.gpu_fraction).collect();
        assert_eq!(fractions, [0.5, 1.0, 1.0]);
        // 200 samples/s alone; a GPU's fraction of it each.
        assert_eq!(f.samples_per_second, 0.5 * 200_000.0 + 2.0 * 200_000.0);
        assert_eq!(f.gpu_equivalents, 2.5);
        // 100 µs of the plan hold 0.5 × 100 / 50 = 1 background iteration on rank 0.
        assert_eq!(f.gpus[0].iterations_per_foreground_iteration, 1.0);
    }

    #[test]
    fn only_a_gpu_the_plan_computes_on_slows_it() {
        // Rank 0 holds 80 of 100 bytes: the job's 30 do not fit beside it, unless the
        // 20 of workspace both hold are counted once.
        let sim = simulation(vec![rank(60.0, 100.0, 80)], 100.0);
        let apart = fill(2, &sim, &[0.0], &JOB, (100, 0), 0.1);
        assert!(matches!(
            apart.gpus[0].excluded,
            Some(Excluded::Memory {
                needed_bytes: 110,
                ..
            })
        ));
        // The unused second GPU runs it alone, which slows nothing.
        assert_eq!(apart.gpus[1].gpu_fraction, 1.0);
        assert_eq!(apart.foreground_slowdown, 0.0);
        assert_eq!(apart.foreground_iteration_us, 100.0);
        let shared = fill(2, &sim, &[0.0], &JOB, (100, 20), 0.1);
        assert!(shared.gpus[0].excluded.is_none());
        assert!((shared.foreground_slowdown - 0.1).abs() < 1e-12);
        assert!((shared.foreground_iteration_us - 110.0).abs() < 1e-9);
        // Its share of the GPU is unchanged; its idle time stretches with the plan.
        assert_eq!(shared.gpus[0].gpu_fraction, 0.4);
        assert!((shared.gpus[0].idle_us - 44.0).abs() < 1e-9);
    }
}
