//! `ralpc launch` and `ralpc run` under a launcher: one process per rank, meeting at a TCP
//! rendezvous. The losses equal the threaded run's bit for bit, and a rank that dies,
//! panics or hangs stops every process with an error naming it.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use assert_cmd::Command;

fn ralpc() -> Command {
    let mut cmd = Command::cargo_bin("ralpc").expect("binary built");
    cmd.env("NO_COLOR", "1")
        .env_remove("RANK")
        .env_remove("OMPI_COMM_WORLD_RANK")
        .env_remove("SLURM_PROCID");
    cmd
}

fn losses(stdout: &[u8]) -> Vec<f64> {
    let json: serde_json::Value = serde_json::from_slice(stdout).expect("one JSON object");
    json["losses"]
        .as_array()
        .expect("losses")
        .iter()
        .map(|v| v.as_f64().expect("a number"))
        .collect()
}

#[test]
fn processes_train_exactly_like_threads() {
    let (_dir, plan) = common::pipeline_plan();
    let threads = ralpc()
        .arg("run")
        .arg(&plan)
        .args(["--steps", "3", "--json"])
        .assert()
        .success();
    let processes = ralpc()
        .arg("launch")
        .arg(&plan)
        .args(["--steps", "3", "--json"])
        .assert()
        .success();
    let out = &processes.get_output().stdout;
    let json: serde_json::Value = serde_json::from_slice(out).expect("only rank 0 prints");
    assert_eq!(json["processes"], 4);
    assert_eq!(losses(out), losses(&threads.get_output().stdout));
}

/// Collectives inside a layer's passes cross processes too: an LSTM split by its gates
/// (its state all-reduced every step) and synchronized batch normalization (statistics
/// summed over the data-parallel ranks).
#[test]
fn collectives_inside_layers_run_across_processes_as_across_threads() {
    let dir = tempfile::tempdir().expect("temp dir");
    let strategy = dir.path().join("gates.json");
    std::fs::write(
        &strategy,
        r#"{"format": "ralpc-strategy/1", "microbatches": 1, "schedule": "1f1b",
            "stages": [{"first_layer": "lstm", "last_layer": "fc", "replicas": 4}],
            "layers": [{"name": "lstm", "split": {"sample": 2, "attribute": 1, "parameter": 2}}]}"#,
    )
    .expect("strategy written");
    let cases = [
        (
            "lstm",
            "train/lstm.onnx",
            vec!["--strategy-file".to_owned(), strategy.display().to_string()],
        ),
        (
            "densenet",
            "train/densenet.onnx",
            ["--strategy", "dp", "--tolerance", "inf"]
                .map(String::from)
                .to_vec(),
        ),
    ];
    for (name, model, args) in cases {
        let plan = dir.path().join(name);
        ralpc()
            .arg(common::fixture(model))
            .args(["--gpus", "4", "--batch", "8"])
            .args(&args)
            .args(["--quiet", "-o"])
            .arg(&plan)
            .assert()
            .success();
        let threads = ralpc()
            .arg("run")
            .arg(&plan)
            .args(["--steps", "2", "--json"])
            .assert()
            .success();
        let processes = ralpc()
            .arg("launch")
            .arg(&plan)
            .args(["--steps", "2", "--json"])
            .assert()
            .success();
        let out = &processes.get_output().stdout;
        let json: serde_json::Value = serde_json::from_slice(out).expect("only rank 0 prints");
        assert_eq!(json["processes"], 4, "{name}");
        assert_eq!(losses(out), losses(&threads.get_output().stdout), "{name}");
    }
}

/// A launcher's processes checkpoint as the threads of one process do: rank 0 gathers
/// every rank's pieces of the weights and momentum (here split by output channels, by
/// columns and by rows) and writes the same file, and processes resumed from it give the
/// losses of an uninterrupted run, bit for bit.
#[test]
fn processes_checkpoint_and_resume_as_threads_do() {
    let dir = tempfile::tempdir().expect("temp dir");
    let strategy = dir.path().join("soap.json");
    std::fs::write(
        &strategy,
        r#"{"format": "ralpc-strategy/1", "microbatches": 1, "schedule": "1f1b",
            "stages": [{"first_layer": "conv0", "last_layer": "fc1", "replicas": 4}],
            "layers": [
              {"name": "conv1", "split": {"sample": 2, "attribute": 1, "parameter": 2}},
              {"name": "pool1", "split": {"sample": 2, "attribute": 1, "parameter": 2}},
              {"name": "fc0", "split": {"sample": 1, "attribute": 1, "parameter": 4}},
              {"name": "fc1", "split": {"sample": 1, "attribute": 4, "parameter": 1}}]}"#,
    )
    .expect("strategy written");
    let plan = dir.path().join("plan");
    ralpc()
        .arg(common::fixture("train/cnn.onnx"))
        .args(["--gpus", "4", "--batch", "8", "--quiet", "--strategy-file"])
        .arg(&strategy)
        .arg("-o")
        .arg(&plan)
        .assert()
        .success();
    let by_threads = dir.path().join("threads.safetensors");
    let by_processes = dir.path().join("processes.safetensors");
    for (command, file) in [("run", &by_threads), ("launch", &by_processes)] {
        ralpc()
            .arg(command)
            .arg(&plan)
            .args(["--steps", "2", "--checkpoint-every", "2", "--checkpoint"])
            .arg(file)
            .assert()
            .success();
    }
    let written = std::fs::read(&by_processes).expect("rank 0 wrote the checkpoint");
    assert!(
        written == std::fs::read(&by_threads).expect("written"),
        "the processes' checkpoint differs from the threads'"
    );
    let whole = ralpc()
        .arg("run")
        .arg(&plan)
        .args(["--steps", "4", "--json"])
        .assert()
        .success();
    let resumed = ralpc()
        .arg("launch")
        .arg(&plan)
        .args(["--steps", "4", "--json", "--resume"])
        .arg(&by_processes)
        .assert()
        .success();
    let bits = |out: &[u8]| losses(out).iter().map(|l| l.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(&resumed.get_output().stdout),
        bits(&whole.get_output().stdout)
    );
}

/// Plans the MLP fixture for two data-parallel ranks into `dir`.
fn two_rank_plan(dir: &Path) -> std::path::PathBuf {
    let plan = dir.join("mlp");
    ralpc()
        .arg(common::fixture("train/mlp.onnx"))
        .args([
            "--gpus",
            "2",
            "--batch",
            "4",
            "--strategy",
            "dp",
            "--tolerance",
            "inf",
        ])
        .args(["--quiet", "-o"])
        .arg(&plan)
        .assert()
        .success();
    plan
}

/// The losses of two steps of `plan` with every rank a thread of one process.
fn threaded_losses(plan: &Path) -> Vec<f64> {
    let threads = ralpc()
        .arg("run")
        .arg(plan)
        .args(["--steps", "2", "--json"])
        .assert()
        .success();
    losses(&threads.get_output().stdout)
}

/// `ralpc run` as rank `r` of 2 under a torchrun-like environment with `token`.
fn rank_process(plan: &Path, r: u32, port: u16, token: &str) -> std::process::Child {
    rank_command(plan, r, port, token)
        .spawn()
        .expect("start a rank")
}

/// `ralpc run` of two steps of `plan` as rank `r` of 2, meeting at `port`.
fn rank_command(plan: &Path, r: u32, port: u16, token: &str) -> std::process::Command {
    let mut command = std::process::Command::new(assert_cmd::cargo::cargo_bin("ralpc"));
    command
        .arg("run")
        .arg(plan)
        .args(["--steps", "2", "--json", "--timeout", "20"])
        .env("RANK", r.to_string())
        .env("WORLD_SIZE", "2")
        .env("LOCAL_RANK", r.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("RALPC_RUN_TOKEN", token)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    command
}

/// What ranks 0 and 1 printed, once both have finished, each successfully (else its
/// error is the failure).
fn both_finish(
    zero: std::process::Child,
    one: std::process::Child,
) -> (std::process::Output, std::process::Output) {
    let zero = zero.wait_with_output().expect("rank 0");
    let one = one.wait_with_output().expect("rank 1");
    for (rank, out) in [(0, &zero), (1, &one)] {
        assert!(
            out.status.success(),
            "rank {rank}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    (zero, one)
}

/// Rank 0 takes over the rendezvous socket it is handed (as `ralpc launch` hands it, so
/// that nothing can take the port between the launcher's pick and rank 0's bind). Here
/// the test keeps its own copy of the socket open all run: rank 0 could not bind the
/// port again, so the run finishing shows that it listened on the socket handed over.
#[test]
fn rank_zero_listens_on_the_socket_it_is_handed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let plan = two_rank_plan(dir.path());
    let socket = std::net::TcpListener::bind("127.0.0.1:0").expect("a socket");
    let port = socket.local_addr().expect("its address").port();
    let secret = "this test run's own secret, too";
    let mut zero = rank_command(&plan, 0, port, secret);
    ralpc::hand_over(
        &mut zero,
        &socket,
        ralpc::runtime::dist::rendezvous::LISTENER_FD_VAR,
    );
    let zero = zero.spawn().expect("start rank 0");
    let one = rank_process(&plan, 1, port, secret);
    let (zero, _) = both_finish(zero, one);
    assert_eq!(losses(&zero.stdout), threaded_losses(&plan));
    drop(socket);
}

/// A live two-process run with strangers at its master port — an impostor rank 1 with the
/// wrong secret, 100 kB of random bytes, an HTTP request and a connection that says
/// nothing — refuses each, logs it, and finishes with the threaded run's losses. Before,
/// the impostor joined and forged the losses, and the others ended the run.
#[test]
fn strangers_at_the_master_port_are_refused_and_the_run_finishes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let plan = two_rank_plan(dir.path());
    let port = ralpc::runtime::dist::testing::free_port();
    let secret = "the real run's secret, 32 chars";
    let mut zero = rank_process(&plan, 0, port, secret);
    let master = ("127.0.0.1", port);
    let mut connect = || loop {
        if let Ok(s) = std::net::TcpStream::connect(master) {
            return s;
        }
        if let Ok(Some(status)) = zero.try_wait() {
            let mut log = String::new();
            if let Some(mut e) = zero.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut log);
            }
            panic!("rank 0 ended ({status}) before it listened: {log}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _idle = connect();
    let mut noise = connect();
    let bytes: Vec<u8> = (0..100_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let _ = std::io::Write::write_all(&mut noise, &bytes);
    let mut http = connect();
    let _ = std::io::Write::write_all(&mut http, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    let impostor = rank_process(&plan, 1, port, "an impostor's guessed secret");
    let impostor = impostor.wait_with_output().expect("the impostor ends");
    assert!(!impostor.status.success(), "the impostor is refused");
    let one = rank_process(&plan, 1, port, secret);
    let zero = zero.wait_with_output().expect("rank 0");
    let one = one.wait_with_output().expect("rank 1");
    let log = String::from_utf8_lossy(&zero.stderr);
    assert!(zero.status.success(), "{log}");
    assert!(
        one.status.success(),
        "{}",
        String::from_utf8_lossy(&one.stderr)
    );
    // The impostor and the random bytes fail the challenge; the HTTP request and the idle
    // connection are still waiting for their 10 s to run out when the run is done.
    assert!(log.matches("refused a connection").count() >= 2, "{log}");
    assert_eq!(losses(&zero.stdout), threaded_losses(&plan));
}

/// `ralpc run` started by hand as torchrun would: two processes, environment only.
#[test]
fn run_joins_a_launchers_world() {
    let dir = tempfile::tempdir().expect("temp dir");
    let plan = two_rank_plan(dir.path());
    let port = ralpc::runtime::dist::testing::free_port();
    let rank = |r: u32| rank_process(&plan, r, port, "this test run's own secret");
    let (one, zero) = (rank(1), rank(0));
    let (zero, one) = both_finish(zero, one);
    assert!(one.stdout.is_empty(), "rank 1 stays quiet");
    assert_eq!(losses(&zero.stdout), threaded_losses(&plan));
}

fn launch_with_fault(plan: &Path, fault: &str) -> (String, Duration) {
    let started = Instant::now();
    let out = ralpc()
        .arg("launch")
        .arg(plan)
        .args([
            "--grace",
            "5",
            "--steps",
            "2",
            "--timeout",
            "2",
            "--fault",
            fault,
        ])
        .assert()
        .code(4);
    (
        String::from_utf8_lossy(&out.get_output().stderr).into_owned(),
        started.elapsed(),
    )
}

#[test]
fn a_failing_process_stops_every_process() {
    let (_dir, plan) = common::pipeline_plan();
    // Gone without a word: the others see its connections close, before any timeout.
    let (stderr, took) = launch_with_fault(&plan, "2:3:exit");
    assert!(stderr.contains("rank 2's process exited"), "{stderr}");
    assert!(
        stderr.contains("rank 2 of 4 exited with status 137 without a word"),
        "{stderr}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
    // A panic is caught and spread as an abort naming it.
    let (stderr, _) = launch_with_fault(&plan, "1:4:panic");
    assert!(
        stderr.contains("rank 1 of 4 exited with status 4: rank 1, instruction 4"),
        "{stderr}"
    );
    assert!(stderr.contains("panicked"), "{stderr}");
    // Silent: a rank waiting on it times out, names it, and the abort reaches everyone.
    let (stderr, took) = launch_with_fault(&plan, "0:2:hang");
    assert!(stderr.contains("waited more than 2 s"), "{stderr}");
    assert!(stderr.contains("stopped by an injected fault"), "{stderr}");
    assert!(took < Duration::from_secs(15), "{took:?}");
}

#[test]
fn a_malformed_launcher_environment_is_an_input_error() {
    let (_dir, plan) = common::pipeline_plan();
    let out = ralpc()
        .arg("run")
        .arg(&plan)
        .env("RANK", "zero")
        .env("WORLD_SIZE", "4")
        .assert()
        .code(1);
    let stderr = String::from_utf8_lossy(&out.get_output().stderr);
    assert!(stderr.contains("RANK='zero'"), "{stderr}");
    let out = ralpc()
        .arg("launch")
        .arg(&plan)
        .args(["--nproc", "300", "--timeout", "5"])
        .assert()
        .code(1);
    let stderr = String::from_utf8_lossy(&out.get_output().stderr);
    assert!(
        stderr.contains("--nproc 300: the plan has 4 ranks, one process each"),
        "{stderr}"
    );
    // A launcher's world of another size is refused before any connection.
    let out = ralpc()
        .arg("run")
        .arg(&plan)
        .env("RANK", "0")
        .env("WORLD_SIZE", "4294967295")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", "9")
        .env("RALPC_RUN_TOKEN", "a secret of this test")
        .assert()
        .code(1);
    let stderr = String::from_utf8_lossy(&out.get_output().stderr);
    assert!(stderr.contains("4294967295"), "{stderr}");
}

/// The ranks `ralpc launch` (process `launcher`) started, once they all run.
#[cfg(target_os = "linux")]
fn ranks_of(launcher: u32, count: usize) -> Vec<u32> {
    let started = Instant::now();
    loop {
        let children =
            std::fs::read_to_string(format!("/proc/{launcher}/task/{launcher}/children"))
                .unwrap_or_default();
        let pids: Vec<u32> = children
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        if pids.len() >= count || started.elapsed() > Duration::from_secs(20) {
            return pids;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether process `pid` still runs (not gone, not a zombie waiting to be reaped).
#[cfg(target_os = "linux")]
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit(')').next().map(|r| r.trim_start().to_owned()))
        .is_some_and(|state| !state.starts_with('Z') && !state.starts_with('X'))
}

/// SIGTERM to `ralpc launch` is passed on to its ranks, which stop with it; SIGKILL
/// (which it cannot catch) takes the ranks along too. Before, both left the ranks
/// running under PID 1.
#[cfg(target_os = "linux")]
#[test]
fn signals_to_the_launcher_stop_its_ranks() {
    let (_dir, plan) = common::pipeline_plan();
    let bin = assert_cmd::cargo::cargo_bin("ralpc");
    for (signal, name) in [(15, "TERM"), (9, "KILL")] {
        let mut launcher = std::process::Command::new(&bin)
            .arg("launch")
            .arg(&plan)
            .args(["--steps", "1000000", "--timeout", "60"])
            .env_remove("RANK")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("launch starts");
        let ranks = ranks_of(launcher.id(), 4);
        assert_eq!(ranks.len(), 4, "SIG{name}: the ranks started");
        std::thread::sleep(Duration::from_millis(500));
        std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(launcher.id().to_string())
            .status()
            .expect("kill runs");
        let status = launcher.wait().expect("the launcher ends");
        assert!(!status.success(), "SIG{name}");
        let started = Instant::now();
        while ranks.iter().any(|&r| running(r)) && started.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let left: Vec<u32> = ranks.iter().copied().filter(|&r| running(r)).collect();
        assert!(left.is_empty(), "SIG{name}: ranks {left:?} still run");
        if signal == 15 {
            let mut stderr = String::new();
            use std::io::Read as _;
            launcher
                .stderr
                .take()
                .expect("stderr")
                .read_to_string(&mut stderr)
                .expect("reads");
            assert!(stderr.contains("interrupted by signal 15"), "{stderr}");
        }
    }
}

/// A rank that stops making progress (SIGSTOP) is named as the cause, not the rank that
/// timed out waiting for it.
#[cfg(target_os = "linux")]
#[test]
fn a_stopped_rank_is_named_not_the_rank_waiting_for_it() {
    let (_dir, plan) = common::pipeline_plan();
    let bin = assert_cmd::cargo::cargo_bin("ralpc");
    let launcher = std::process::Command::new(&bin)
        .arg("launch")
        .arg(&plan)
        .args(["--grace", "1", "--steps", "1000000", "--timeout", "2"])
        .env_remove("RANK")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("launch starts");
    let mut ranks = ranks_of(launcher.id(), 4);
    ranks.sort_unstable();
    assert_eq!(ranks.len(), 4);
    std::thread::sleep(Duration::from_millis(500));
    // Processes are started in rank order: the third pid is rank 2.
    std::process::Command::new("kill")
        .args(["-STOP", &ranks[2].to_string()])
        .status()
        .expect("kill runs");
    let out = launcher.wait_with_output().expect("the launcher ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(
        stderr.contains("ranks [2] stopped making progress"),
        "{stderr}"
    );
}

/// A bad run option is a usage error of `ralpc launch` itself (exit 2, said once), not
/// one error per rank and "exited without a word".
#[test]
fn a_bad_run_option_is_a_usage_error_before_any_rank_starts() {
    let (_dir, plan) = common::pipeline_plan();
    let out = ralpc()
        .arg("launch")
        .arg(&plan)
        .arg("--bogus")
        .assert()
        .code(2);
    let stderr = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert_eq!(
        stderr.matches("unexpected argument '--bogus'").count(),
        1,
        "{stderr}"
    );
}
