//! Fingerprints the sources a plan depends on (the planner's crates and the lock file), so
//! that `ralpc plan --check` and build systems caching on a plan's recorded inputs see a
//! rebuilt ralpc whose plans may differ, not only a new version number.

use std::path::{Path, PathBuf};

/// The crates whose code decides a plan's content.
const PLANNING: [&str; 5] = ["src", "ir/src", "passes/src", "codegen/src", "Cargo.lock"];

fn main() {
    let root = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let mut files = Vec::new();
    for entry in PLANNING {
        let path = root.join(entry);
        println!("cargo::rerun-if-changed={}", path.display());
        collect(&path, &mut files);
    }
    files.sort();
    let mut hasher = blake3::Hasher::new();
    for file in &files {
        let relative = file.strip_prefix(&root).unwrap_or(file);
        hasher.update(relative.to_string_lossy().as_bytes());
        // A file that cannot be read leaves only its name in the fingerprint.
        let bytes = std::fs::read(file).unwrap_or_default();
        hasher.update(&(bytes.len() as u64).to_le_bytes());
        hasher.update(&bytes);
    }
    println!(
        "cargo::rustc-env=RALPC_SOURCE_HASH={}",
        hasher.finalize().to_hex()
    );
}

/// Every file under `path` (itself, when it is one).
fn collect(path: &Path, files: &mut Vec<PathBuf>) {
    if path.is_file() {
        files.push(path.to_path_buf());
        return;
    }
    let Ok(entries) = std::fs::read_dir(path) else {
        return;
    };
    for entry in entries.flatten() {
        collect(&entry.path(), files);
    }
}
