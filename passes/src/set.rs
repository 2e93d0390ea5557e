//! Several models trained on one cluster at once (Hydra's multi-model training, a
//! hyperparameter sweep, an ensemble): which GPUs each trains on.
//!
//! Each model is priced alone on a number of GPUs (its own plan: data, burst, pipeline or
//! tensor parallel, whichever is fastest there). The GPUs are then cut into groups of
//! consecutive GPUs; each group trains some of the models, which take turns on it an
//! iteration each (task parallelism over model parallelism, as Hydra's SHARP schedules
//! its models' shards over shared GPUs, here at the granularity of whole iterations). The
//! set is done when its slowest group is: [`place`] finds the groups, their GPU counts
//! and their models that finish soonest, by dynamic programming over the subsets of
//! models. Training them one after another on all the GPUs, and each on an even share of
//! them, are two of the placements it considers.

use std::collections::BTreeMap;

/// One model of the set.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    /// Its iteration on `g` GPUs, µs, for each count it was priced at (absent: it does
    /// not plan there, e.g. does not fit).
    pub iteration_us: BTreeMap<u32, f64>,
    /// Iterations it trains for.
    pub iterations: u64,
}

impl Job {
    /// Its whole training on `g` GPUs, µs, when priced there.
    fn time_us(&self, g: u32) -> Option<f64> {
        self.iteration_us
            .get(&g)
            .map(|t| t * self.iterations as f64)
    }
}

/// GPUs some models share, one after another.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    /// The models, by index, in the order they take turns.
    pub jobs: Vec<usize>,
    /// Its GPUs.
    pub gpus: u32,
    /// Its first GPU (groups are consecutive GPUs, in order).
    pub first_gpu: u32,
    /// Until its last model is done, µs.
    pub time_us: f64,
}

/// Where every model of a set trains.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// The groups, by first GPU.
    pub groups: Vec<Group>,
    /// Until the last group is done, µs.
    pub makespan_us: f64,
}

/// What [`solve`] found for (a set of jobs, GPUs left): the soonest they finish, the group
/// holding the set's lowest job and its GPUs; `None` where they cannot be placed.
type Memo = BTreeMap<(usize, u32), Option<(f64, usize, u32)>>;

/// The most models [`place`] takes: its work grows as 3 to the number of models.
pub const MAX_JOBS: usize = 10;

/// The placement of `jobs` on `gpus` GPUs that finishes soonest: groups of consecutive
/// GPUs of the counts the jobs were priced at, each training some of the jobs one after
/// another, largest group first. `None` when some job is priced at no count that fits, or there are more than
/// [`MAX_JOBS`].
pub fn place(jobs: &[Job], gpus: u32) -> Option<Placement> {
    let k = jobs.len();
    if k == 0 || k > MAX_JOBS {
        return None;
    }
    let counts: Vec<u32> = {
        let mut c: Vec<u32> = jobs
            .iter()
            .flat_map(|j| j.iteration_us.keys().copied())
            .filter(|&g| g >= 1 && g <= gpus)
            .collect();
        c.sort_unstable();
        c.dedup();
        c
    };
    // What a set of jobs takes together on g GPUs (None where one is not priced there).
    let together = |set: usize, g: u32| -> Option<f64> {
        (0..k)
            .filter(|i| set & (1 << i) != 0)
            .map(|i| jobs[i].time_us(g))
            .sum()
    };
    let mut memo = Memo::new();
    let best = solve((1 << k) - 1, gpus, &counts, &together, &mut memo)?;
    // Unfold the choices into groups, then lay them out largest first: with counts of
    // whole nodes and powers of two within one, each group then starts on a boundary of
    // its own size, where a plan on that many GPUs from GPU 0 is priced.
    let (mut set, mut left) = ((1usize << k) - 1, gpus);
    let mut groups = Vec::new();
    while set != 0 {
        let (_, group, g) = memo.get(&(set, left)).copied().flatten()?;
        groups.push(Group {
            jobs: (0..k).filter(|i| group & (1 << i) != 0).collect(),
            gpus: g,
            first_gpu: 0,
            time_us: together(group, g)?,
        });
        set &= !group;
        left -= g;
    }
    groups.sort_by_key(|g| std::cmp::Reverse(g.gpus));
    let mut first = 0;
    for group in &mut groups {
        group.first_gpu = first;
        first += group.gpus;
    }
    Some(Placement {
        groups,
        makespan_us: best,
    })
}

/// The soonest the jobs of `set` finish on `left` GPUs, memoized with the group chosen
/// (the one holding the set's lowest job) and its GPUs.
fn solve(
    set: usize,
    left: u32,
    counts: &[u32],
    together: &dyn Fn(usize, u32) -> Option<f64>,
    memo: &mut Memo,
) -> Option<f64> {
    if set == 0 {
        return Some(0.0);
    }
    if let Some(found) = memo.get(&(set, left)) {
        return found.map(|(t, _, _)| t);
    }
    let lowest = set & set.wrapping_neg();
    let rest = set & !lowest;
    let mut best: Option<(f64, usize, u32)> = None;
    // Every group holding the lowest job: it with each subset of the rest.
    let mut others = rest;
    loop {
        let group = lowest | others;
        for &g in counts.iter().take_while(|&&g| g <= left) {
            let Some(own) = together(group, g) else {
                continue;
            };
            if best.is_some_and(|(t, _, _)| own >= t) {
                continue;
            }
            let Some(after) = solve(set & !group, left - g, counts, together, memo) else {
                continue;
            };
            let t = own.max(after);
            if best.is_none_or(|(b, _, _)| t < b) {
                best = Some((t, group, g));
            }
        }
        if others == 0 {
            break;
        }
        others = (others - 1) & rest;
    }
    memo.insert((set, left), best);
    best.map(|(t, _, _)| t)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job whose iteration on g GPUs takes `one / g^scaling` µs.
    fn job(one: f64, scaling: f64, counts: &[u32]) -> Job {
        Job {
            iteration_us: counts
                .iter()
                .map(|&g| (g, one / f64::from(g).powf(scaling)))
                .collect(),
            iterations: 1,
        }
    }

    #[test]
    fn jobs_that_scale_perfectly_may_share_or_split_alike() {
        let counts = [1, 2, 4, 8];
        let jobs = vec![job(800.0, 1.0, &counts), job(800.0, 1.0, &counts)];
        let p = place(&jobs, 8).expect("placed");
        // Sequentially on 8: 100 + 100; each on 4: 200 both. Either way 200.
        assert!((p.makespan_us - 200.0).abs() < 1e-9);
    }

    #[test]
    fn jobs_that_scale_badly_take_gpus_of_their_own() {
        // Each on 8 GPUs only twice as fast as on one: split 4 + 4 beats taking turns.
        let counts = [1, 2, 4, 8];
        let jobs = vec![
            job(800.0, 1.0 / 3.0, &counts),
            job(800.0, 1.0 / 3.0, &counts),
        ];
        let p = place(&jobs, 8).expect("placed");
        assert_eq!(p.groups.len(), 2);
        assert_eq!(
            p.groups
                .iter()
                .map(|g| (g.first_gpu, g.gpus))
                .collect::<Vec<_>>(),
            [(0, 4), (4, 4)]
        );
        assert!((p.makespan_us - 800.0 / 4f64.powf(1.0 / 3.0)).abs() < 1e-9);
    }

    #[test]
    fn a_large_and_two_small_jobs_are_balanced() {
        let counts: Vec<u32> = (1..=8).collect();
        // One job scaling perfectly from 1,200 µs, two of 100 µs that do not scale.
        let jobs = vec![
            job(1200.0, 1.0, &counts),
            job(100.0, 0.0, &counts),
            job(100.0, 0.0, &counts),
        ];
        let p = place(&jobs, 8).expect("placed");
        // The two small ones share one GPU (200 µs); the large one takes 7 (171 µs).
        assert!((p.makespan_us - 200.0).abs() < 1e-9, "{p:?}");
        let total: u32 = p.groups.iter().map(|g| g.gpus).sum();
        assert!(total <= 8);
    }

    #[test]
    fn a_job_priced_nowhere_cannot_be_placed() {
        let jobs = vec![
            job(100.0, 1.0, &[1, 2]),
            Job {
                iteration_us: BTreeMap::new(),
                iterations: 1,
            },
        ];
        assert_eq!(place(&jobs, 2), None);
    }
}
