//! `plan.svg`: the plan's graph drawn by Graphviz, within a time limit.

/// Why `plan.svg` was not written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SvgSkipped {
    /// Graphviz's `dot` is not installed.
    NoGraphviz,
    /// `dot` ran past [`SVG_SECONDS`] and was stopped.
    TimedOut,
    /// `dot` failed.
    Failed,
}

impl std::fmt::Display for SvgSkipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SvgSkipped::NoGraphviz => write!(f, "Graphviz (dot) is not installed"),
            SvgSkipped::TimedOut => write!(
                f,
                "Graphviz took over {SVG_SECONDS} s to lay the graph out and was stopped \
                 (plan.dot has it)"
            ),
            SvgSkipped::Failed => write!(f, "Graphviz failed on plan.dot"),
        }
    }
}

/// The longest Graphviz may take to draw `plan.svg`: planning is fast, and the picture of
/// a large model (DenseNet-121: 1,035 boxes, 784 edges) took `dot` minutes.
pub const SVG_SECONDS: u64 = 10;

/// Layers above which `dot` is asked for a cheaper layout (straight edges, fewer
/// crossing-reduction and ranking passes).
const CHEAP_LAYOUT_NODES: usize = 200;

/// Whether Graphviz's `dot` can be run: then a plan's artifacts include `plan.svg`.
pub fn graphviz_installed() -> bool {
    std::process::Command::new("dot")
        .arg("-V")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `dot` rendered to SVG with Graphviz, within [`SVG_SECONDS`].
///
/// # Errors
/// Why there is no SVG.
pub fn render_svg(dot: &str) -> Result<String, SvgSkipped> {
    use std::io::{Read as _, Write as _};
    let mut command = std::process::Command::new("dot");
    command.arg("-Tsvg");
    if dot.matches("label=").count() > CHEAP_LAYOUT_NODES {
        command.args([
            "-Gsplines=line",
            "-Gnslimit=2",
            "-Gnslimit1=2",
            "-Gmclimit=0.2",
        ]);
    }
    command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    // A killed ralpc leaves no `dot` behind (SIGKILL: 9).
    crate::process::die_with_parent(&mut command, 9);
    let mut child = command.spawn().map_err(|_| SvgSkipped::NoGraphviz)?;
    // Feed and drain on threads: a large graph fills the pipes both ways.
    let mut stdin = child.stdin.take().ok_or(SvgSkipped::Failed)?;
    let input = dot.to_owned();
    let feeder = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let mut stdout = child.stdout.take().ok_or(SvgSkipped::Failed)?;
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        stdout.read_to_end(&mut out).map(|_| out)
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(SVG_SECONDS);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(SvgSkipped::TimedOut);
            }
        }
    };
    let fed = feeder.join().map_err(|_| SvgSkipped::Failed)?;
    let out = reader.join().map_err(|_| SvgSkipped::Failed)?;
    match (status.success(), fed, out) {
        (true, Ok(()), Ok(out)) => Ok(String::from_utf8_lossy(&out).into_owned()),
        _ => Err(SvgSkipped::Failed),
    }
}
