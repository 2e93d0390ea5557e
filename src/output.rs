//! The one way ralpc writes a file: plans, reports, strategies, profiles, sweeps, emitted
//! scripts and checkpoints all go through here.
//!
//! ralpc often runs as root on GPU nodes and writes into directories that others may write
//! into too, so a write must never follow a link planted at a predictable name, and a
//! killed or failing write must never leave a partial file:
//! * each file is written to a temporary file created exclusively (`O_CREAT | O_EXCL`,
//!   which does not follow a link at that name) under a random name in the target's own
//!   directory, flushed to disk, then renamed over the target (a rename replaces a link
//!   rather than writing through it), and the directory is flushed so the rename survives
//!   a power loss;
//! * the directory is locked (`flock`) while ralpc writes into it, so two ralpc processes
//!   writing one output directory cannot interleave their sets, and temporaries that a
//!   killed ralpc left there are removed (no live ralpc can own them while the lock is
//!   held).

use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::error::FileError;
use crate::Error;

/// How every temporary file's name ends; a file so named in a locked directory is a
/// leftover of a killed write.
const TEMPORARY: &str = ".ralpc-tmp";

/// Writes `text` to `path` atomically (see the module's documentation).
///
/// # Errors
/// [`Error::Write`] when the directory is not writable, the disk is full, or a folder has
/// the file's name.
pub fn write_atomically(path: &Path, text: &str) -> Result<(), Error> {
    write_bytes_atomically(path, text.as_bytes())
}

/// As [`write_atomically`], for bytes.
///
/// # Errors
/// [`Error::Write`] when the file cannot be written.
pub fn write_bytes_atomically(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let dir = parent(path);
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        let error = std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file name");
        return Err(failed(path, error));
    };
    write_set_atomically(&dir, &[(name, bytes)])
}

/// Writes every `(name, contents)` into `dir` as one set, under the directory's lock: each
/// goes to a temporary file first, and only when all are written are they renamed into
/// place, in order (so the last one, `plan.json`, marks the set complete). A failure
/// before the renames — a full disk, a name taken by a folder — leaves `dir` as it was.
///
/// # Errors
/// [`Error::Write`] naming the file that could not be written.
pub fn write_set_atomically<B: AsRef<[u8]>>(dir: &Path, files: &[(&str, B)]) -> Result<(), Error> {
    let _lock = lock(dir)?;
    let mut staged = Vec::with_capacity(files.len());
    for (name, contents) in files {
        let path = dir.join(name);
        if path.is_dir() {
            let taken = std::io::Error::new(
                std::io::ErrorKind::IsADirectory,
                "a folder has the artifact's name",
            );
            return Err(failed(&path, taken));
        }
        let temporary = stage(dir, name, contents.as_ref()).map_err(|e| failed(&path, e))?;
        staged.push((temporary, path));
    }
    // Dropping the ones not renamed yet removes them.
    for (temporary, path) in staged {
        temporary
            .persist(&path)
            .map_err(|e| failed(&path, e.error))?;
    }
    sync_directory(dir).map_err(|e| failed(dir, e))
}

/// A file that is written and flushed under a random name beside its place.
fn stage(dir: &Path, name: &str, contents: &[u8]) -> std::io::Result<tempfile::NamedTempFile> {
    // A name of up to 255 bytes stays one once the prefix and suffix are added.
    let short: String = name.chars().take(64).collect();
    let prefix = format!(".{short}.");
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(TEMPORARY).rand_bytes(12);
    #[cfg(unix)]
    {
        // As `std::fs::write` creates files: readable by all unless the umask says not.
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o666));
    }
    let mut file = builder.tempfile_in(dir)?;
    file.write_all(contents)?;
    file.as_file().sync_all()?;
    Ok(file)
}

fn parent(path: &Path) -> PathBuf {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_path_buf()
}

fn failed(path: &Path, error: std::io::Error) -> Error {
    Error::Write(Box::new(FileError {
        path: path.display().to_string(),
        error,
    }))
}

#[cfg(unix)]
fn sync_directory(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(not(unix))]
fn sync_directory(_: &Path) -> std::io::Result<()> {
    Ok(())
}

thread_local! {
    /// The directories this thread holds locked, with how many guards hold each: a write
    /// made while its caller holds the directory (the plan command holds its output
    /// directory across every artifact) must not wait for itself.
    static HELD: RefCell<HashMap<PathBuf, (File, usize)>> = RefCell::new(HashMap::new());
}

/// An output directory locked against other ralpc processes (and other threads) writing
/// into it; unlocked when dropped.
#[must_use = "the directory is unlocked when the guard is dropped"]
#[derive(Debug)]
pub struct DirLock {
    key: PathBuf,
}

/// Locks `dir` (which must exist), waiting while another ralpc writes into it, and removes
/// the temporaries killed writes left there.
///
/// # Errors
/// [`Error::Write`] when `dir` cannot be opened or locked.
pub fn lock(dir: &Path) -> Result<DirLock, Error> {
    let key = dir.canonicalize().map_err(|e| failed(dir, e))?;
    let held = HELD.with_borrow_mut(|held| match held.get_mut(&key) {
        Some((_, count)) => {
            *count += 1;
            true
        }
        None => false,
    });
    if held {
        return Ok(DirLock { key });
    }
    let file = File::open(&key).map_err(|e| failed(dir, e))?;
    match lock_exclusive(&file) {
        // A file system without locks (some network mounts) still gets atomic files.
        Err(e) if !matches!(e.raw_os_error(), Some(libc::ENOLCK | libc::EOPNOTSUPP)) => {
            return Err(failed(dir, e))
        }
        _ => {}
    }
    remove_leftovers(&key);
    HELD.with_borrow_mut(|held| held.insert(key.clone(), (file, 1)));
    Ok(DirLock { key })
}

/// `flock(LOCK_EX)`, waiting; released when the file is closed.
#[cfg(unix)]
fn lock_exclusive(file: &File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    loop {
        // SAFETY: flock(2) on a descriptor `file` owns and keeps open for the call.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(not(unix))]
fn lock_exclusive(_: &File) -> std::io::Result<()> {
    Ok(())
}

impl Drop for DirLock {
    fn drop(&mut self) {
        HELD.with_borrow_mut(|held| {
            if let Some((_, count)) = held.get_mut(&self.key) {
                *count -= 1;
                if *count == 0 {
                    // Closing the file releases the lock.
                    held.remove(&self.key);
                }
            }
        });
    }
}

/// Removes `.NAME.RANDOM.ralpc-tmp` files from a directory this process has just locked:
/// every ralpc holds the lock while its temporaries exist, so these are a killed
/// process's. Best effort: one that cannot be removed stays.
fn remove_leftovers(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let is_file = entry
            .file_type()
            .is_ok_and(|t| t.is_file() || t.is_symlink());
        if is_file && name.starts_with('.') && name.ends_with(TEMPORARY) {
            // Removes a link, never what it points to.
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Checks, before long work, that `path` can be written: its directory exists and takes a
/// new file (one is created and removed).
///
/// # Errors
/// [`Error::Write`] naming `path` and why.
pub fn check_writable(path: &Path) -> Result<(), Error> {
    if path.is_dir() {
        let taken = std::io::Error::new(std::io::ErrorKind::IsADirectory, "a folder has its name");
        return Err(failed(path, taken));
    }
    let dir = parent(path);
    tempfile::Builder::new()
        .prefix(".probe.")
        .suffix(TEMPORARY)
        .tempfile_in(&dir)
        .map(drop)
        .map_err(|e| failed(path, e))
}

/// Refuses, unless `force`, to write `output` where it would replace one of `inputs` (the
/// same file, also through a link or another path).
///
/// # Errors
/// [`Error::OverwritesInput`] naming both.
pub fn refuse_overwriting_inputs(
    output: &Path,
    inputs: &[&Path],
    force: bool,
) -> Result<(), Error> {
    if force {
        return Ok(());
    }
    for input in inputs {
        if same_file(output, input) {
            return Err(Error::OverwritesInput(Box::new((
                output.display().to_string(),
                input.display().to_string(),
            ))));
        }
    }
    Ok(())
}

/// Whether `a` and `b` name one existing file.
fn same_file(a: &Path, b: &Path) -> bool {
    let (Ok(a), Ok(b)) = (std::fs::metadata(a), std::fs::metadata(b)) else {
        return false;
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        a.dev() == b.dev() && a.ino() == b.ino()
    }
    #[cfg(not(unix))]
    {
        let _ = (a, b);
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A link planted at any name a write could use is replaced, never written through.
    #[cfg(unix)]
    #[test]
    fn a_planted_link_is_replaced_not_followed() {
        let dir = tempfile::tempdir().expect("temp dir");
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").expect("write");
        let target = dir.path().join("plan.json");
        std::os::unix::fs::symlink(&victim, &target).expect("link");
        // The old scheme's predictable temporary name, planted too.
        let old = dir
            .path()
            .join(format!(".plan.json.{}.tmp", std::process::id()));
        std::os::unix::fs::symlink(&victim, &old).expect("link");
        write_atomically(&target, "{}").expect("writes");
        assert_eq!(std::fs::read_to_string(&victim).expect("read"), "precious");
        assert_eq!(std::fs::read_to_string(&target).expect("read"), "{}");
        assert!(!std::fs::symlink_metadata(&target)
            .expect("stat")
            .file_type()
            .is_symlink());
    }

    #[test]
    fn leftovers_of_a_killed_write_are_removed_and_nothing_else() {
        let dir = tempfile::tempdir().expect("temp dir");
        let leftover = dir.path().join(".plan.json.abcdefabcdef.ralpc-tmp");
        let kept = dir.path().join(".hidden");
        std::fs::write(&leftover, "partial").expect("write");
        std::fs::write(&kept, "mine").expect("write");
        write_atomically(&dir.path().join("report.html"), "<html>").expect("writes");
        assert!(!leftover.exists());
        assert!(kept.exists());
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }

    /// The plan command holds its directory across every write; writes inside must not
    /// wait for it, and another thread must.
    #[test]
    fn the_lock_is_reentrant_within_a_thread_and_excludes_others() {
        let dir = tempfile::tempdir().expect("temp dir");
        let held = lock(dir.path()).expect("locks");
        write_atomically(&dir.path().join("a"), "1").expect("writes while held");
        let path = dir.path().to_path_buf();
        let (tx, rx) = std::sync::mpsc::channel();
        let other = std::thread::spawn(move || {
            let _lock = lock(&path).expect("locks");
            tx.send(()).expect("send");
        });
        assert!(rx
            .recv_timeout(std::time::Duration::from_millis(200))
            .is_err());
        drop(held);
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("the other thread locks once released");
        other.join().expect("joins");
    }

    #[test]
    fn a_failed_set_leaves_the_directory_as_it_was() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir(dir.path().join("b")).expect("mkdir");
        let err = write_set_atomically(dir.path(), &[("a", "1"), ("b", "2")]).unwrap_err();
        assert!(err.to_string().contains('b'), "{err}");
        assert!(!dir.path().join("a").exists());
        assert_eq!(std::fs::read_dir(dir.path()).expect("list").count(), 1);
    }

    #[cfg(unix)]
    #[test]
    fn an_output_that_is_an_input_is_refused_unless_forced() {
        let dir = tempfile::tempdir().expect("temp dir");
        let model = dir.path().join("model.onnx");
        std::fs::write(&model, "bytes").expect("write");
        let alias = dir.path().join("alias.onnx");
        std::os::unix::fs::symlink(&model, &alias).expect("link");
        let err = refuse_overwriting_inputs(&alias, &[&model], false).unwrap_err();
        assert_eq!(err.exit_code(), 1);
        refuse_overwriting_inputs(&alias, &[&model], true).expect("forced");
        refuse_overwriting_inputs(&dir.path().join("new"), &[&model], false).expect("new");
    }
}
