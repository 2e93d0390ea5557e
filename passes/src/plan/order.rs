//! The order of each stage's passes: GPipe, 1F1B (and PipeDream's asynchronous variant),
//! zero-bubble ZB-H1 and Megatron-LM's interleaved 1F1B. The lowering emits these orders
//! and the evaluator prices the synchronous ones by playing them, so both read them here.

use super::Schedule;

/// A stage's work item on one microbatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// The forward pass.
    Forward(u32),
    /// The backward pass: input and weight gradients, or only the input gradients when
    /// the schedule runs the weight gradients apart ([`Pass::Weight`]).
    Backward(u32),
    /// The weight gradients of an earlier [`Pass::Backward`] (zero-bubble schedules).
    Weight(u32),
}

/// The order of stage `k`'s passes, of `stages` stages and `microbatches` microbatches.
///
/// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, §3.1) keeps 1F1B's
/// forwards and backwards and splits each backward into its input gradients (`B`, on the
/// critical path) and its weight gradients (`W`, which nothing waits for). Stage `k` runs
/// each `W` `k` backwards late, so the last stages, which wait longest for the first
/// gradient, fill that wait with earlier weight passes, and the rest end the iteration:
/// PyTorch's `_get_1f1b_rank_ops` with `enable_zero_bubble` (torch 2.9,
/// `torch/distributed/pipelining/schedules.py`, checked against torch 2.15) orders it the
/// same. Every stage then holds `min(P, M)` microbatches: the first all in flight, as under
/// 1F1B; a later one fewer in flight and the rest waiting for their weight passes, which
/// keep only what those read (a GEMM's input and its output's gradient).
pub fn passes(schedule: Schedule, stages: usize, k: usize, microbatches: u32) -> Vec<Pass> {
    let m = microbatches;
    match schedule {
        Schedule::GPipe => (0..m)
            .map(Pass::Forward)
            .chain((0..m).map(Pass::Backward))
            .collect(),
        Schedule::OneFOneB | Schedule::Async => one_f_one_b(stages, k, m, None),
        Schedule::ZeroBubble => one_f_one_b(stages, k, m, Some(k as u32)),
    }
}

/// 1F1B's order, and with `lag` each backward's weight pass `lag` backwards after it (the
/// rest at the end).
fn one_f_one_b(stages: usize, k: usize, m: u32, lag: Option<u32>) -> Vec<Pass> {
    let warm = ((stages - k - 1) as u32).min(m);
    let mut out: Vec<Pass> = (0..warm).map(Pass::Forward).collect();
    let mut weighed = 0;
    let mut backward = |out: &mut Vec<Pass>, mb: u32| {
        out.push(Pass::Backward(mb));
        if lag.is_some_and(|lag| mb >= lag) {
            out.push(Pass::Weight(weighed));
            weighed += 1;
        }
    };
    for i in 0..m - warm {
        out.push(Pass::Forward(warm + i));
        backward(&mut out, i);
    }
    for mb in m - warm..m {
        backward(&mut out, mb);
    }
    if lag.is_some() {
        out.extend((weighed..m).map(Pass::Weight));
    }
    out
}

/// The order of pipeline rank `g`'s passes under Megatron-LM's interleaved 1F1B schedule
/// (Narayanan et al., §2.2), `devices` pipeline ranks of `v` virtual stages each: its
/// chunk (virtual stage `chunk · devices + g`) and pass. Microbatches go through in groups
/// of `devices`, chunk by chunk; rank `g` warms up with `2(devices − g − 1) + (v − 1) ·
/// devices` forwards (all of them when the microbatches are as many as the ranks).
pub fn interleaved(devices: usize, v: usize, g: usize, microbatches: u32) -> Vec<(usize, Pass)> {
    let m = microbatches as usize;
    let total = m * v;
    let warm = if m == devices {
        total
    } else {
        (2 * (devices - g - 1) + (v - 1) * devices).min(total)
    };
    let chunk = |k: usize, forward: bool| {
        let c = (k % (devices * v)) / devices;
        if forward {
            c
        } else {
            v - 1 - c
        }
    };
    let mb = |k: usize| ((k / (devices * v)) * devices + k % devices) as u32;
    let mut out: Vec<(usize, Pass)> = (0..warm)
        .map(|k| (chunk(k, true), Pass::Forward(mb(k))))
        .collect();
    for i in 0..total - warm {
        let k = warm + i;
        out.push((chunk(k, true), Pass::Forward(mb(k))));
        out.push((chunk(i, false), Pass::Backward(mb(i))));
    }
    out.extend((total - warm..total).map(|i| (chunk(i, false), Pass::Backward(mb(i)))));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn letters(passes: &[Pass]) -> String {
        passes
            .iter()
            .map(|p| match p {
                Pass::Forward(m) => format!("F{m}"),
                Pass::Backward(m) => format!("B{m}"),
                Pass::Weight(m) => format!("W{m}"),
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn zero_bubble_runs_each_stages_weight_passes_as_many_backwards_late_as_its_index() {
        // Four stages, eight microbatches, as the paper's Figure 3 draws them.
        let z = |k| letters(&passes(Schedule::ZeroBubble, 4, k, 8));
        assert_eq!(
            z(0),
            "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7"
        );
        assert_eq!(
            z(3),
            "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7"
        );
        // Every stage runs each pass once, a weight pass after its backward.
        for k in 0..4 {
            let order = passes(Schedule::ZeroBubble, 4, k, 8);
            for mb in 0..8 {
                let at = |p| order.iter().position(|&q| q == p).unwrap();
                assert!(at(Pass::Forward(mb)) < at(Pass::Backward(mb)));
                assert!(at(Pass::Backward(mb)) < at(Pass::Weight(mb)));
            }
            assert_eq!(order.len(), 24);
        }
        // Fewer microbatches than stages.
        assert_eq!(
            letters(&passes(Schedule::ZeroBubble, 4, 3, 2)),
            "F0 B0 F1 B1 W0 W1"
        );
        // 1F1B itself is unchanged: no weight passes.
        assert_eq!(
            letters(&passes(Schedule::OneFOneB, 4, 0, 5)),
            "F0 F1 F2 F3 B0 F4 B1 B2 B3 B4"
        );
    }
}
