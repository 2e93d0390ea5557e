//! The order of each stage's passes: GPipe, 1F1B (and PipeDream's asynchronous variant),
//! zero-bubble ZB-H1 and ZB-V, and Megatron-LM's interleaved 1F1B. The lowering emits
//! these orders and the evaluators price the synchronous ones by playing them, so all of
//! them read them here.

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
        // ZB-V needs two chunks a group ([`group_passes`]); alone, a stage runs ZB-H1.
        Schedule::ZeroBubble | Schedule::ZeroBubbleV => one_f_one_b(stages, k, m, Some(k as u32)),
    }
}

/// The order of pipeline group `g`'s passes, of `groups` groups holding `v` chunks each
/// (stage [`stage_of_chunk`]): its chunk and pass.
pub fn group_passes(
    schedule: Schedule,
    groups: usize,
    v: usize,
    g: usize,
    microbatches: u32,
) -> Vec<(usize, Pass)> {
    match schedule {
        Schedule::ZeroBubbleV if v == 2 => zb_v(groups, g, microbatches),
        _ if v > 1 => interleaved(groups, v, g, microbatches),
        _ => (passes(schedule, groups, g, microbatches).into_iter())
            .map(|pass| (0, pass))
            .collect(),
    }
}

/// The stage that chunk `chunk` of pipeline group `g` is, of `groups` groups: interleaved,
/// stage `chunk · groups + g` (Narayanan et al.'s assignment); under ZB-V the model goes
/// down the groups and back up, so group `g` holds stages `g` and `2·groups − 1 − g` (Qi et
/// al., §6: the first group holds the first and the last stage).
pub fn stage_of_chunk(schedule: Schedule, groups: usize, chunk: usize, g: usize) -> usize {
    match schedule {
        Schedule::ZeroBubbleV if chunk == 1 => 2 * groups - 1 - g,
        _ => chunk * groups + g,
    }
}

/// The pipeline group and chunk of stage `k` of `groups · v` stages ([`stage_of_chunk`]).
pub fn group_of_stage(schedule: Schedule, groups: usize, k: usize) -> (usize, usize) {
    let groups = groups.max(1);
    match schedule {
        Schedule::ZeroBubbleV if (groups..2 * groups).contains(&k) => (2 * groups - 1 - k, 1),
        _ => (k % groups, k / groups),
    }
}

/// ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, §6): two chunks a group,
/// laid out as a V ([`stage_of_chunk`]), each backward split into its input gradients and
/// its weight gradients. Group `g` of `P` warms up with `2(P − g) − 1` forwards of its first
/// chunk, then `g` pairs of forwards (second chunk, first chunk), then `P − g` rounds of its
/// second chunk's forward, backward and weight pass; in the steady state each round is a
/// forward, backward and weight pass of the first chunk, then of the second; it cools down
/// with `g` pairs of backwards (first chunk, second chunk), `P − g` backwards of the first
/// chunk each with a weight pass, and the weight passes still owed, the second chunk's
/// first. Built for `max(M, 2P − 1)` microbatches and cut to the `M` there are, so fewer
/// microbatches keep the order's shape. PyTorch's `ScheduleZBVZeroBubble`
/// (`torch/distributed/pipelining/schedules.py`, torch 2.15) orders its passes the same.
/// A group holds 1F1B's activations: at most `2P` chunk-microbatches, `P` stages' worth.
fn zb_v(groups: usize, g: usize, microbatches: u32) -> Vec<(usize, Pass)> {
    let (p, g) = (groups as u32, g as u32);
    let n = microbatches.max(2 * p - 1);
    let mut order = VOrder::default();
    for _ in 0..2 * (p - g) - 1 {
        order.forward(0);
    }
    for _ in 0..g {
        order.forward(1);
        order.forward(0);
    }
    for _ in 0..p - g {
        order.forward(1);
        order.backward(1);
        order.weight(1);
    }
    while order.forwards[1] < order.forwards[0] || order.forwards[0] < n {
        if order.forwards[0] < n {
            order.forward(0);
        }
        for c in [0, 1] {
            if c == 1 {
                order.forward(1);
            }
            order.backward(c);
            order.weight(c);
        }
    }
    for _ in 0..g {
        order.backward(0);
        order.backward(1);
    }
    for _ in 0..p - g {
        order.backward(0);
        order.weight(0);
    }
    while order.weights[1] < order.backwards[1] {
        order.weight(1);
    }
    while order.weights[0] < order.backwards[0] {
        order.weight(0);
    }
    order.passes.retain(|(_, pass)| match *pass {
        Pass::Forward(mb) | Pass::Backward(mb) | Pass::Weight(mb) => mb < microbatches,
    });
    order.passes
}

/// A two-chunk order being built: each chunk's passes so far, by kind.
#[derive(Default)]
struct VOrder {
    passes: Vec<(usize, Pass)>,
    forwards: [u32; 2],
    backwards: [u32; 2],
    weights: [u32; 2],
}

impl VOrder {
    fn forward(&mut self, c: usize) {
        self.passes.push((c, Pass::Forward(self.forwards[c])));
        self.forwards[c] += 1;
    }

    fn backward(&mut self, c: usize) {
        self.passes.push((c, Pass::Backward(self.backwards[c])));
        self.backwards[c] += 1;
    }

    fn weight(&mut self, c: usize) {
        self.passes.push((c, Pass::Weight(self.weights[c])));
        self.weights[c] += 1;
    }
}

/// The most microbatches each of `chunks` chunks holds at once in `order`: activations
/// (forwarded, not yet through their backward) and owed weight passes (through their
/// backward, not yet their weight pass; an order without weight passes owes every
/// backward's, so read its activations alone), each chunk's own peak.
pub fn peak_held(order: &[(usize, Pass)], chunks: usize) -> Vec<(u32, u32)> {
    let mut peak = vec![(0u32, 0u32); chunks];
    holdings(order, chunks, |now| {
        for (p, h) in peak.iter_mut().zip(now) {
            *p = (p.0.max(h.0), p.1.max(h.1));
        }
    });
    peak
}

/// The most `weigh(chunk, activations, owed weight passes)` summed over the chunks takes at
/// any point of `order`: a group's peak when its chunks' microbatches differ in size.
pub fn peak_weighed(
    order: &[(usize, Pass)],
    chunks: usize,
    weigh: impl Fn(usize, u32, u32) -> f64,
) -> f64 {
    let mut peak = 0.0f64;
    holdings(order, chunks, |now| {
        let total: f64 = (now.iter().enumerate())
            .map(|(k, &(a, w))| weigh(k, a, w))
            .sum();
        peak = peak.max(total);
    });
    peak
}

/// Calls `seen` after each pass of `order` with what each of `chunks` chunks then holds:
/// (activations, owed weight passes) in microbatches.
fn holdings(order: &[(usize, Pass)], chunks: usize, mut seen: impl FnMut(&[(u32, u32)])) {
    let mut now = vec![(0u32, 0u32); chunks];
    for &(c, pass) in order {
        let Some(held) = now.get_mut(c) else { continue };
        match pass {
            Pass::Forward(_) => held.0 += 1,
            Pass::Backward(_) => {
                held.0 = held.0.saturating_sub(1);
                held.1 += 1;
            }
            Pass::Weight(_) => held.1 = held.1.saturating_sub(1),
        }
        seen(&now);
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

    fn chunked(order: &[(usize, Pass)]) -> String {
        order
            .iter()
            .map(|&(c, p)| {
                let name = letters(&[p]);
                format!("{}{}", &name[..1], if c == 0 { "" } else { "'" }) + &name[1..]
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn zb_v_runs_each_groups_two_chunks_down_the_v_and_back() {
        // Two groups of two chunks (stages 0 and 3 on group 0, 1 and 2 on group 1), four
        // microbatches; a primed letter is the second chunk.
        assert_eq!(
            chunked(&group_passes(Schedule::ZeroBubbleV, 2, 2, 0, 4)),
            "F0 F1 F2 F'0 B'0 W'0 F'1 B'1 W'1 F3 B0 W0 F'2 B'2 W'2 B1 W1 F'3 B'3 W'3 \
             B2 W2 B3 W3"
        );
        assert_eq!(
            chunked(&group_passes(Schedule::ZeroBubbleV, 2, 2, 1, 4)),
            "F0 F'0 F1 F'1 B'0 W'0 F2 B0 W0 F'2 B'1 W'1 F3 B1 W1 F'3 B'2 W'2 B2 B'3 \
             B3 W2 W'3 W3"
        );
        for (p, m) in [(1usize, 1u32), (2, 1), (3, 2), (4, 8), (4, 5), (8, 40)] {
            for g in 0..p {
                let order = group_passes(Schedule::ZeroBubbleV, p, 2, g, m);
                assert_eq!(order.len(), 6 * m as usize, "P {p} M {m} group {g}");
                for c in 0..2 {
                    for mb in 0..m {
                        let at = |pass| order.iter().position(|&q| q == (c, pass)).unwrap();
                        assert!(at(Pass::Forward(mb)) < at(Pass::Backward(mb)));
                        assert!(at(Pass::Backward(mb)) < at(Pass::Weight(mb)));
                    }
                }
                // 1F1B's activations: each chunk's peak as `Strategy::in_flight` counts it,
                // and the group at most 2P chunk-microbatches at once.
                let held = peak_held(&order, 2);
                assert_eq!(held[0].0, (2 * p - g).min(m as usize) as u32);
                assert_eq!(held[1].0, (g + 1).min(m as usize) as u32);
                let at_once = peak_weighed(&order, 2, |_, a, _| f64::from(a));
                assert!(
                    at_once <= (2 * p) as f64,
                    "P {p} M {m} group {g}: {at_once}"
                );
            }
        }
        // The V: group g holds stages g and 2P − 1 − g.
        assert_eq!(stage_of_chunk(Schedule::ZeroBubbleV, 4, 1, 0), 7);
        assert_eq!(group_of_stage(Schedule::ZeroBubbleV, 4, 5), (2, 1));
        assert_eq!(group_of_stage(Schedule::OneFOneB, 4, 5), (1, 1));
    }
}
