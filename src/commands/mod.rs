//! One module per subcommand: an `Args` struct and a `run` that calls one library function.

pub mod cluster;
pub mod doctor;
pub mod inspect;
pub mod launch;
pub mod plan;
pub mod profile;
pub mod run;
pub mod sweep;

use std::collections::BTreeMap;
use std::io::Write;

use ralpc::runtime::cuda::libs::{self, Lib, Resolution};

/// Set in a restart by [`restart_with`]: `name=path` of each library linked, `;`-separated.
const CUDA_RESTARTED: &str = "RALPC_CUDA_RESTARTED";

/// Makes `libs` loadable: when some are found only outside the loader's path, starts this
/// process again (once) with a path that has them. Returns only when they load.
pub fn restart_with(wanted: &[Lib]) -> Result<(), ralpc::Error> {
    let setup = |message: String| ralpc::Error::setup(message);
    let (library_path, found) = match libs::resolve(wanted)? {
        Resolution::Ready => return Ok(()),
        Resolution::Restart {
            library_path,
            found,
        } => (library_path, found),
    };
    if std::env::var_os(CUDA_RESTARTED).is_some() {
        return Err(match libs::check(wanted) {
            Err(e) => e.into(),
            Ok(()) => setup(
                "the CUDA libraries do not load even from the directories they were found in"
                    .into(),
            ),
        });
    }
    let exe = std::env::current_exe()
        .map_err(|e| setup(format!("cannot find the ralpc executable to restart: {e}")))?;
    let marker: Vec<String> = found
        .iter()
        .map(|(lib, path)| format!("{}={}", lib.stem(), path.display()))
        .collect();
    use std::os::unix::process::CommandExt;
    let error = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env("LD_LIBRARY_PATH", library_path)
        .env(CUDA_RESTARTED, marker.join(";"))
        .exec();
    Err(setup(format!(
        "cannot restart ralpc with the CUDA libraries' path: {error}"
    )))
}

/// The libraries a restart linked, and from where.
pub fn linked_cuda_libs() -> BTreeMap<Lib, String> {
    let marker = std::env::var(CUDA_RESTARTED).unwrap_or_default();
    marker
        .split(';')
        .filter_map(|entry| entry.split_once('='))
        .filter_map(|(stem, path)| {
            Lib::ALL
                .into_iter()
                .find(|l| l.stem() == stem)
                .map(|l| (l, format!("from {path}")))
        })
        .collect()
}

/// Writes an artifact to stdout; a closed pipe (`| head`) is not an error.
/// A progress bar on stderr drawn with `template` (of `len` steps; `None`: a spinner that
/// ticks by itself). It appears only after a moment, so quick commands and early errors
/// draw nothing, and only on a terminal (indicatif draws nothing elsewhere);
/// `finish_and_clear` removes it.
pub fn progress(template: &str, len: Option<u64>, visible: bool) -> indicatif::ProgressBar {
    use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
    let bar = ProgressBar::hidden();
    if let Some(len) = len {
        bar.set_length(len);
    }
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    if visible {
        let weak = bar.downgrade();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(400));
            if let Some(bar) = weak.upgrade().filter(|b| !b.is_finished()) {
                bar.set_draw_target(ProgressDrawTarget::stderr());
                if len.is_none() {
                    bar.enable_steady_tick(std::time::Duration::from_millis(120));
                }
            }
        });
    }
    bar
}

/// A [`progress`] spinner saying `message`.
pub fn spinner(message: String, visible: bool) -> indicatif::ProgressBar {
    let bar = progress("{spinner} {msg} {elapsed}", None, visible);
    bar.set_message(message);
    bar
}

pub fn print_stdout(text: &str) {
    let mut out = std::io::stdout().lock();
    // A closed pipe (`ralpc inspect … | head`) is the reader's choice, not a failure; any
    // other write error (a full disk) is reported.
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            let _ = writeln!(std::io::stderr(), "error: cannot write to stdout: {e}");
        }
    }
}

pub use ralpc::args::{
    parse_input_shape, parse_input_value, parse_learning_rate, parse_momentum, parse_positive,
    parse_seconds, parse_tolerance,
};
