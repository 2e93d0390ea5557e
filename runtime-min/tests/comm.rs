//! Ranks as threads: every collective gives NCCL's result, bit for bit the same whatever
//! order the ranks arrive in, and a failing rank stops the others instead of hanging them.

use std::time::{Duration, Instant};

use ralpc_runtime_min::dist::comm::{AbortOnPanic, CommError, World};

/// Runs `body(rank)` on `ranks` threads; their results in rank order.
fn on_ranks<T: Send>(
    ranks: u32,
    timeout: Duration,
    body: impl Fn(&ralpc_runtime_min::dist::comm::Comm) -> T + Sync,
) -> Vec<std::thread::Result<T>> {
    let world = World::new(ranks, timeout);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..ranks)
            .map(|r| {
                let comm = world.comm(r);
                let body = &body;
                s.spawn(move || {
                    let _guard = AbortOnPanic(&comm);
                    body(&comm)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join()).collect()
    })
}

fn data(rank: u32, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (rank as f32 + 1.0) * 0.1 + i as f32 * 1e-3)
        .collect()
}

#[test]
fn collectives_give_nccl_results_in_rank_order() {
    let group = [0u32, 1, 2, 3];
    let results = on_ranks(4, Duration::from_secs(10), |comm| {
        let r = comm.rank();
        // Arrive in a scrambled order.
        std::thread::sleep(Duration::from_millis(u64::from((r * 7) % 4) * 5));
        let mut sum = data(r, 8);
        comm.all_reduce(&group, &mut sum).unwrap();
        let gathered = comm.all_gather(&group, &data(r, 2)).unwrap();
        let scattered = comm.reduce_scatter(&group, &data(r, 8)).unwrap();
        let exchanged = comm.all_to_all(&group, &data(r, 8)).unwrap();
        (sum, gathered, scattered, exchanged)
    });
    let results: Vec<_> = results.into_iter().map(Result::unwrap).collect();
    let mut expected_sum = vec![0.0f32; 8];
    for r in 0..4 {
        expected_sum
            .iter_mut()
            .zip(data(r, 8))
            .for_each(|(e, v)| *e += v);
    }
    for (r, (sum, gathered, scattered, exchanged)) in results.iter().enumerate() {
        assert_eq!(
            sum, &expected_sum,
            "every rank holds the same sum, bit for bit"
        );
        assert_eq!(
            gathered,
            &(0..4).flat_map(|q| data(q, 2)).collect::<Vec<_>>()
        );
        assert_eq!(scattered, &expected_sum[r * 2..r * 2 + 2].to_vec());
        let from_each: Vec<f32> = (0..4)
            .flat_map(|q| data(q, 8)[r * 2..r * 2 + 2].to_vec())
            .collect();
        assert_eq!(exchanged, &from_each);
    }
}

#[test]
fn messages_and_overlapping_groups() {
    let results = on_ranks(4, Duration::from_secs(10), |comm| {
        let r = comm.rank();
        // Pairs {0,1} and {2,3} reduce independently, then all four.
        let pair = if r < 2 { [0, 1] } else { [2, 3] };
        let mut v = vec![r as f32];
        comm.all_reduce(&pair, &mut v).unwrap();
        let mut all = vec![1.0];
        comm.all_reduce(&[0, 1, 2, 3], &mut all).unwrap();
        // A ring of messages.
        comm.send((r + 1) % 4, 7, vec![r as f32]).unwrap();
        let got = comm.recv((r + 3) % 4, 7).unwrap();
        (v[0], all[0], got[0])
    });
    for (r, res) in results.into_iter().enumerate() {
        let (pair, all, got) = res.unwrap();
        assert_eq!(pair, if r < 2 { 1.0 } else { 5.0 });
        assert_eq!(all, 4.0);
        assert_eq!(got, ((r + 3) % 4) as f32);
    }
}

#[test]
fn a_panicking_rank_stops_the_others() {
    let started = Instant::now();
    let results = on_ranks(3, Duration::from_secs(60), |comm| {
        if comm.rank() == 1 {
            panic!("rank 1 fails before the collective");
        }
        let mut v = vec![1.0];
        comm.all_reduce(&[0, 1, 2], &mut v)
    });
    assert!(results[1].is_err(), "rank 1 panicked");
    for r in [0, 2] {
        let err = results[r].as_ref().unwrap().as_ref().unwrap_err();
        assert_eq!(err, &CommError::Aborted("rank 1 panicked".into()));
    }
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "no one waited for the timeout"
    );
}

#[test]
fn a_missing_peer_times_out_and_names_what_was_awaited() {
    let world = World::new(2, Duration::from_millis(200));
    let comm = world.comm(0);
    let err = comm.recv(1, 3).unwrap_err();
    assert!(
        matches!(&err, CommError::Timeout { rank: 0, what, .. } if what.contains("rank 1 with tag 3")),
        "{err}"
    );
    // The world is now failed for everyone.
    assert!(matches!(
        world.comm(1).send(0, 1, vec![]),
        Err(CommError::Aborted(_))
    ));
}
