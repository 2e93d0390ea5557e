//! The order of each stage's passes: GPipe, 1F1B (and PipeDream's asynchronous variant)
//! and Megatron-LM's interleaved 1F1B.

use ralpc_passes::plan::Schedule;

/// A stage's work item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pass {
    Forward(u32),
    Backward(u32),
}

/// The order of one stage's passes.
pub(super) fn order(schedule: Schedule, stages: usize, k: usize, microbatches: u32) -> Vec<Pass> {
    let m = microbatches;
    match schedule {
        Schedule::GPipe => (0..m)
            .map(Pass::Forward)
            .chain((0..m).map(Pass::Backward))
            .collect(),
        Schedule::OneFOneB | Schedule::Async => {
            let warm = ((stages - k - 1) as u32).min(m);
            let mut out: Vec<Pass> = (0..warm).map(Pass::Forward).collect();
            for i in 0..m - warm {
                out.push(Pass::Forward(warm + i));
                out.push(Pass::Backward(i));
            }
            out.extend((m - warm..m).map(Pass::Backward));
            out
        }
    }
}

/// The order of pipeline rank `g`'s passes under Megatron-LM's interleaved 1F1B schedule
/// (Narayanan et al., §2.2), `devices` pipeline ranks of `v` virtual stages each: its
/// chunk (virtual stage `chunk · devices + g`) and pass. Microbatches go through in groups
/// of `devices`, chunk by chunk; rank `g` warms up with `2(devices − g − 1) + (v − 1) ·
/// devices` forwards (all of them when the microbatches are as many as the ranks).
pub(super) fn interleaved(
    devices: usize,
    v: usize,
    g: usize,
    microbatches: u32,
) -> Vec<(usize, Pass)> {
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
