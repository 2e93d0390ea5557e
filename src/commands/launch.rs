//! `ralpc launch PLAN [--nproc N] [RUN OPTIONS]`: one `ralpc run` process per rank on this
//! machine, as torchrun would start them.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use ralpc::runtime::dist::rendezvous::LISTENER_FD_VAR;

pub const EXAMPLES: &str = "\
Examples:
  ralpc fixtures/train/cnn.onnx --gpus 4 --batch 8 -o cnn.ralpc
  ralpc launch cnn.ralpc --steps 5           # 4 processes, one per rank
  ralpc launch cnn.ralpc --steps 5 --json    # rank 0 prints the JSON of `ralpc run`

Every process is `ralpc run PLAN [RUN OPTIONS]` with RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set; the ranks meet at a rendezvous on
this machine and talk over TCP. When one process fails the others stop (they see its
connection close, or time out after --timeout); any still running after --grace
seconds are killed. For several machines use your own launcher (torchrun, srun,
mpirun) with `ralpc run`.";

/// Arguments of `ralpc launch`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The plan: a directory `ralpc plan` wrote, or its plan.json.
    pub plan: PathBuf,
    /// Processes to start: the plan's ranks, one each (another count is refused).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub nproc: Option<u32>,
    /// Seconds the others get to stop after a process fails, before they are killed.
    #[arg(long, default_value_t = 10, value_parser = super::parse_seconds)]
    pub grace: u64,
    /// Passed to every `ralpc run` (--steps, --json, --timeout, …).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "RUN OPTIONS"
    )]
    pub run: Vec<OsString>,
}

fn launch_error(message: String) -> ralpc::Error {
    ralpc::Error::Run(Box::new(message))
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        _ => "stopped".into(),
    }
}

/// `ralpc run`'s own arguments, to check the run options once before any process starts.
#[derive(clap::Parser)]
#[command(name = "ralpc run")]
struct RunOptions {
    #[command(flatten)]
    run: super::run::Args,
}

pub fn run(args: &Args) -> Result<(), ralpc::Error> {
    // A bad run option is a usage error here (exit 2), not one error per rank.
    let check = std::iter::once(OsString::from("ralpc run"))
        .chain(std::iter::once(args.plan.clone().into_os_string()))
        .chain(args.run.iter().cloned());
    if let Err(e) = <RunOptions as clap::Parser>::try_parse_from(check) {
        e.exit();
    }
    let (_, plan) = ralpc::read_plan(&args.plan)?;
    let world = plan.ranks;
    if let Some(n) = args.nproc.filter(|&n| n != world) {
        return Err(ralpc::Error::PlanFile(Box::new(format!(
            "--nproc {n}: the plan has {world} ranks, one process each"
        ))));
    }
    let exe = std::env::current_exe()
        .map_err(|e| launch_error(format!("cannot find the ralpc executable: {e}")))?;
    // The rendezvous socket, bound here and handed to rank 0, so that no one can take its
    // port in between.
    let rendezvous = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| launch_error(format!("no free port for the rendezvous: {e}")))?;
    let port = rendezvous
        .local_addr()
        .map_err(|e| launch_error(format!("no free port for the rendezvous: {e}")))?
        .port();
    let reports = tempfile::tempdir().map_err(|e| {
        launch_error(format!(
            "cannot make a directory for the ranks' errors: {e}"
        ))
    })?;
    let signals = Signals::register()?;
    // The ranks prove this secret to each other; nobody else learns it.
    let token = ralpc::runtime::dist::auth::new_token().map_err(|e| launch_error(e.chain()))?;
    let mut children: Vec<Option<Child>> = Vec::with_capacity(world as usize);
    for rank in 0..world {
        let mut cmd = Command::new(&exe);
        // A rank gets SIGTERM (15) when the launcher dies, however it dies.
        ralpc::die_with_parent(&mut cmd, 15);
        cmd.arg("run").arg(&args.plan).args(&args.run);
        for var in ["OMPI_COMM_WORLD_RANK", "SLURM_PROCID", LISTENER_FD_VAR] {
            cmd.env_remove(var);
        }
        if rank == 0 {
            ralpc::hand_over(&mut cmd, &rendezvous, LISTENER_FD_VAR);
        }
        cmd.env("RANK", rank.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("LOCAL_WORLD_SIZE", world.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env(ralpc::runtime::dist::auth::TOKEN_VAR, &token)
            .env(super::run::LAUNCH_REPORTS, reports.path());
        match cmd.spawn() {
            Ok(child) => children.push(Some(child)),
            Err(e) => {
                kill_all(&mut children);
                return Err(launch_error(format!("cannot start rank {rank}: {e}")));
            }
        }
    }
    // Rank 0 holds the rendezvous socket now: with this copy closed, a rank connecting
    // after rank 0 died is refused instead of waiting in a queue no one reads.
    drop(rendezvous);
    // After the first failure (or a signal) the others get the grace period to stop by
    // themselves.
    let mut first_failure: Option<Instant> = None;
    let mut interrupted: Option<i32> = None;
    let mut failed: Vec<(u32, ExitStatus)> = Vec::new();
    let mut killed = Vec::new();
    while children.iter().any(Option::is_some) {
        if let (None, Some(signal)) = (interrupted, signals.received()) {
            interrupted = Some(signal);
            first_failure.get_or_insert_with(Instant::now);
            for child in children.iter().flatten() {
                forward(child, signal);
            }
        }
        for (rank, slot) in children.iter_mut().enumerate() {
            let Some(child) = slot else { continue };
            match child.try_wait() {
                Ok(Some(status)) => {
                    if !status.success() {
                        first_failure.get_or_insert_with(Instant::now);
                        failed.push((rank as u32, status));
                    }
                    *slot = None;
                }
                Ok(None) => {}
                Err(e) => {
                    kill_all(&mut children);
                    return Err(launch_error(format!("cannot watch rank {rank}: {e}")));
                }
            }
        }
        if let Some(at) = first_failure {
            if at.elapsed() > Duration::from_secs(args.grace) {
                for (rank, slot) in children.iter_mut().enumerate() {
                    if let Some(mut child) = slot.take() {
                        let _ = child.kill();
                        let _ = child.wait();
                        killed.push(rank);
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Some(signal) = interrupted {
        let mut message =
            format!("interrupted by signal {signal}, which was passed on to the {world} rank(s)");
        if !killed.is_empty() {
            message += &format!(
                "; ranks {killed:?} were still running {} s later and were killed",
                args.grace
            );
        }
        return Err(launch_error(message));
    }
    match cause(&failed, reports.path()) {
        None => Ok(()),
        Some((rank, status, error)) => {
            // A rank that times out waiting while others never end (stopped, or spinning)
            // was waiting for those: name them first.
            let waited = error
                .as_deref()
                .is_some_and(|e| e.contains("waited more than"));
            let what = format!(
                "rank {rank} of {world} {}{}",
                describe(status),
                error.map_or_else(
                    || " without a word (killed?)".to_owned(),
                    |e| format!(": {e}")
                )
            );
            let message = match (waited, killed.is_empty()) {
                (true, false) => format!(
                    "ranks {killed:?} stopped making progress: they were still running {} s \
                     after the first failure and were killed ({what}; {} process(es) failed)",
                    args.grace,
                    failed.len()
                ),
                (_, true) => format!("{what}; {} process(es) failed", failed.len()),
                (false, false) => format!(
                    "{what}; {} process(es) failed; ranks {killed:?} were still running {} s \
                     later and were killed",
                    failed.len(),
                    args.grace
                ),
            };
            Err(launch_error(message))
        }
    }
}

/// The failure that caused the others: a process that failed by itself (or died without
/// leaving an error) before one that timed out waiting for another, before those a
/// failure elsewhere aborted.
fn cause(
    failed: &[(u32, ExitStatus)],
    reports: &std::path::Path,
) -> Option<(u32, ExitStatus, Option<String>)> {
    failed
        .iter()
        .map(|&(rank, status)| {
            let error = std::fs::read_to_string(reports.join(format!("rank-{rank}.txt")))
                .ok()
                .map(|e| e.trim_start_matches("the run failed: ").to_owned());
            (rank, status, error)
        })
        .min_by_key(|(_, _, error)| match error.as_deref() {
            Some(e) if e.contains("aborted") => 2,
            Some(e) if e.contains("waited more than") => 1,
            _ => 0,
        })
}

fn kill_all(children: &mut [Option<Child>]) {
    for mut child in children.iter_mut().filter_map(Option::take) {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// SIGINT, SIGTERM and SIGHUP, caught so that the ranks are stopped with the launcher
/// rather than left running without it.
struct Signals {
    #[cfg(unix)]
    received: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Signals {
    fn register() -> Result<Signals, ralpc::Error> {
        #[cfg(unix)]
        {
            use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
            let received = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            for signal in [SIGINT, SIGTERM, SIGHUP] {
                signal_hook::flag::register_usize(signal, received.clone(), signal as usize)
                    .map_err(|e| launch_error(format!("cannot catch signal {signal}: {e}")))?;
            }
            Ok(Signals { received })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    /// The last signal caught, if any.
    fn received(&self) -> Option<i32> {
        #[cfg(unix)]
        {
            let signal = self.received.load(std::sync::atomic::Ordering::SeqCst);
            (signal != 0).then(|| i32::try_from(signal).unwrap_or(15))
        }
        #[cfg(not(unix))]
        None
    }
}

/// Sends `signal` to `child`.
fn forward(child: &Child, signal: i32) {
    #[cfg(unix)]
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill(2) with a valid signal number, on a child not reaped yet (so the
        // pid is still that child's).
        unsafe {
            libc::kill(pid, signal);
        }
    }
    #[cfg(not(unix))]
    let _ = (child, signal);
}
