//! One module per subcommand: an `Args` struct and a `run` that calls one library function.

pub mod cluster;
pub mod inspect;
pub mod launch;
pub mod plan;
pub mod profile;
pub mod run;
pub mod sweep;

use std::io::Write;

/// Writes an artifact to stdout; a closed pipe (`| head`) is not an error.
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

/// Parses `NAME=D0,D1,...` for `--input`.
pub fn parse_input_shape(s: &str) -> Result<(String, Vec<u64>), String> {
    let (name, dims) = s
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=D0,D1,..., got '{s}'"))?;
    if name.is_empty() {
        return Err("the input name is empty".into());
    }
    let dims = dims
        .split(',')
        .map(|d| {
            d.trim()
                .parse::<u64>()
                .map_err(|_| format!("'{d}' is not a dimension (a positive integer)"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((name.to_owned(), dims))
}
