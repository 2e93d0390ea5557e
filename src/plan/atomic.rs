//! Writing artifacts so that a failure never leaves a partial file or a partial set.

use std::path::{Path, PathBuf};

use crate::error::FileError;
use crate::Error;

/// Writes `text` to `path` through a temporary file in the same directory and a rename, so
/// a failure never leaves a partial file.
///
/// # Errors
/// [`Error::Write`] when the directory is not writable or the disk is full.
pub fn write_atomically(path: &Path, text: &str) -> Result<(), Error> {
    write_bytes_atomically(path, text.as_bytes())
}

/// Writes every `(name, text)` into `dir` as one set: each goes to a temporary file beside
/// its place first, and only when all are written are they renamed into place, in order
/// (so the last one, `plan.json`, marks the set complete). A failure before the renames —
/// a full disk, an artifact's name taken by a folder — leaves `dir` as it was.
///
/// # Errors
/// [`Error::Write`] naming the file that could not be written.
pub fn write_set_atomically(dir: &Path, files: &[(&str, &str)]) -> Result<(), Error> {
    let fail = |path: &Path, error| {
        Error::Write(Box::new(FileError {
            path: path.display().to_string(),
            error,
        }))
    };
    let mut staged: Vec<(PathBuf, PathBuf)> = Vec::with_capacity(files.len());
    let unstage = |staged: &[(PathBuf, PathBuf)]| {
        for (temp, _) in staged {
            let _ = std::fs::remove_file(temp);
        }
    };
    for (name, text) in files {
        let path = dir.join(name);
        if path.is_dir() {
            unstage(&staged);
            let taken = std::io::Error::new(
                std::io::ErrorKind::IsADirectory,
                "a folder has the artifact's name",
            );
            return Err(fail(&path, taken));
        }
        let temp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        if let Err(e) = std::fs::write(&temp, text) {
            let _ = std::fs::remove_file(&temp);
            unstage(&staged);
            return Err(fail(&path, e));
        }
        staged.push((temp, path));
    }
    for (i, (temp, path)) in staged.iter().enumerate() {
        if let Err(e) = std::fs::rename(temp, path) {
            unstage(&staged[i..]);
            return Err(fail(path, e));
        }
    }
    Ok(())
}

/// As [`write_atomically`], for bytes.
///
/// # Errors
/// [`Error::Write`] when the file cannot be written.
pub fn write_bytes_atomically(path: &Path, text: &[u8]) -> Result<(), Error> {
    let fail = |source| {
        Error::Write(Box::new(FileError {
            path: path.display().to_string(),
            error: source,
        }))
    };
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let result = std::fs::write(&temp, text).and_then(|()| std::fs::rename(&temp, path));
    if let Err(e) = result {
        let _ = std::fs::remove_file(&temp);
        return Err(fail(e));
    }
    Ok(())
}
