//! Reading a user's input file, bounded: only regular files (not `/dev/zero`, a FIFO or
//! a terminal), and no larger than a limit for their kind, checked before reading and
//! again while reading (a file that grows). `RALPC_MAX_INPUT_BYTES` overrides the limit.

use std::io::Read;
use std::path::Path;

/// What a file is, for its size limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputKind {
    /// An ONNX model: protobuf's own limit, 2 GiB (larger weights go to external data).
    Model,
    /// JSON or TOML written by a person or a tool: a profile, a strategy, a cluster, a
    /// plan, `--data` (a global batch of inputs as JSON text): 1 GiB.
    Text,
    /// A checkpoint's weights and optimizer state: 64 GiB.
    Checkpoint,
}

/// The environment variable that overrides every kind's limit (bytes).
pub const MAX_INPUT_BYTES_VAR: &str = "RALPC_MAX_INPUT_BYTES";

impl InputKind {
    /// The most bytes a file of this kind may hold.
    pub fn limit(self) -> u64 {
        if let Some(bytes) = std::env::var(MAX_INPUT_BYTES_VAR)
            .ok()
            .and_then(|v| v.trim().parse().ok())
        {
            return bytes;
        }
        match self {
            InputKind::Model => 2 << 30,
            InputKind::Text => 1 << 30,
            InputKind::Checkpoint => 64 << 30,
        }
    }

    fn noun(self) -> &'static str {
        match self {
            InputKind::Model => "a model",
            InputKind::Text => "a text input",
            InputKind::Checkpoint => "a checkpoint",
        }
    }
}

/// The bytes of `path`, a regular file within `kind`'s limit.
///
/// # Errors
/// The file cannot be read, is not a regular file, or is over the limit (an
/// [`std::io::ErrorKind::InvalidInput`] error saying which and how to raise the limit).
pub fn read_input(path: &Path, kind: InputKind) -> std::io::Result<Vec<u8>> {
    let limit = kind.limit();
    let over = |len: u64| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "{len} bytes or more, over the limit of {limit} for {} (set {MAX_INPUT_BYTES_VAR} \
                 to raise it)",
                kind.noun()
            ),
        )
    };
    let file = std::fs::File::open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    if meta.len() > limit {
        return Err(over(meta.len()));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(over(bytes.len() as u64));
    }
    Ok(bytes)
}

/// [`read_input`] as UTF-8 text.
///
/// # Errors
/// As [`read_input`], or the bytes are not UTF-8.
pub fn read_input_text(path: &Path, kind: InputKind) -> std::io::Result<String> {
    String::from_utf8(read_input(path, kind)?)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn devices_and_oversized_files_are_refused() {
        let err = read_input(Path::new("/dev/zero"), InputKind::Text).unwrap_err();
        assert_eq!(err.to_string(), "not a regular file");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.json");
        std::fs::write(&path, b"{}").unwrap();
        assert_eq!(read_input_text(&path, InputKind::Text).unwrap(), "{}");
        let f = std::fs::File::options().write(true).open(&path).unwrap();
        f.set_len(InputKind::Model.limit() + 1).unwrap();
        let err = read_input(&path, InputKind::Model).unwrap_err();
        assert!(err.to_string().contains("over the limit"), "{err}");
    }
}
