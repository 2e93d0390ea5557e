//! Checkpoint files (`ralpc-checkpoint/2`): a run's training state between two steps,
//! written atomically by `ralpc run --checkpoint-every N` and read by `--resume`.
//!
//! One header line of JSON, then the tensors' values as little-endian `f32`, in the
//! header's order:
//!
//! ```text
//! {"format":"ralpc-checkpoint/2","plan":"<the plan's inputs hash>","step":3,
//!  "losses":[2.41,2.40,2.38],"tensors":[{"name":"fc0.weight","kind":"weight","len":768},…],
//!  "blake3":"<hash of the values>"}
//! <raw f32 values>
//! ```
//!
//! The losses are stored with every digit (JSON round-trips `f64`), and the weights and
//! momentum buffers bit for bit, so a resumed run continues exactly where it stopped.
//! Reading checks the values' hash (a flipped bit), that they are finite, and — against
//! the model — every trained weight's name and size ([`check_against`]).

use std::collections::BTreeMap;
use std::path::Path;

use ralpc_ir::input::{read_input, InputKind};
use ralpc_runtime_min::cpu::exec::Checkpoint;
use serde::{Deserialize, Serialize};

use crate::error::{Error, FileError};

/// The format tag.
pub const FORMAT: &str = "ralpc-checkpoint/2";

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    format: String,
    plan: String,
    step: u32,
    losses: Vec<f64>,
    tensors: Vec<Entry>,
    /// blake3 of the values after the header line, hex.
    blake3: String,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    kind: Kind,
    len: usize,
}

#[derive(Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum Kind {
    Weight,
    Velocity,
}

/// Writes `checkpoint` of the plan whose inputs hash is `plan` to `path`, atomically.
///
/// # Errors
/// [`Error::Write`] when the file cannot be written.
pub fn write(path: &Path, plan: &str, checkpoint: &Checkpoint) -> Result<(), Error> {
    let mut tensors = Vec::new();
    let mut values: Vec<&[f32]> = Vec::new();
    for (kind, map) in [
        (Kind::Weight, &checkpoint.weights),
        (Kind::Velocity, &checkpoint.velocity),
    ] {
        for (name, v) in map {
            tensors.push(Entry {
                name: name.clone(),
                kind,
                len: v.len(),
            });
            values.push(v);
        }
    }
    let data: Vec<u8> = values
        .iter()
        .flat_map(|v| v.iter().flat_map(|x| x.to_le_bytes()))
        .collect();
    let header = Header {
        format: FORMAT.to_owned(),
        plan: plan.to_owned(),
        step: checkpoint.step,
        losses: checkpoint.losses.clone(),
        tensors,
        blake3: blake3::hash(&data).to_hex().to_string(),
    };
    let mut bytes = serde_json::to_vec(&header).unwrap_or_default();
    bytes.push(b'\n');
    bytes.extend(data);
    crate::plan::write_bytes_atomically(path, &bytes)
}

/// Reads a checkpoint; `plan` is the inputs hash of the plan it must belong to.
///
/// # Errors
/// An unreadable file, a malformed one (the message says where), or one written by a run
/// of another plan.
pub fn read(path: &Path, plan: &str) -> Result<Checkpoint, Error> {
    let bad = |m: String| Error::Checkpoint(Box::new(format!("{}: {m}", path.display())));
    let bytes = read_input(path, InputKind::Checkpoint).map_err(|error| {
        Error::Read(Box::new(FileError {
            path: path.display().to_string(),
            error,
        }))
    })?;
    let end = bytes
        .iter()
        .position(|&b| b == b'\n')
        .ok_or_else(|| bad("no header line".into()))?;
    let header: Header =
        serde_json::from_slice(&bytes[..end]).map_err(|e| bad(format!("header: {e}")))?;
    if header.format != FORMAT {
        return Err(bad(format!(
            "format is \"{}\"; this ralpc reads \"{FORMAT}\"",
            header.format
        )));
    }
    if header.plan != plan {
        return Err(bad(
            "it was written by a run of another plan (its inputs hash differs)".into(),
        ));
    }
    if header.losses.len() != header.step as usize {
        return Err(bad(format!(
            "{} losses for {} steps",
            header.losses.len(),
            header.step
        )));
    }
    let mut data = &bytes[end + 1..];
    if blake3::hash(data).to_hex().as_str() != header.blake3 {
        return Err(bad(
            "its values do not match their hash: the file was damaged after it was written".into(),
        ));
    }
    let mut checkpoint = Checkpoint {
        step: header.step,
        losses: header.losses,
        weights: BTreeMap::new(),
        velocity: BTreeMap::new(),
    };
    for t in header.tensors {
        let size = t
            .len
            .checked_mul(4)
            .filter(|&n| n <= data.len())
            .ok_or_else(|| bad(format!("tensor '{}' is cut short", t.name)))?;
        let values: Vec<f32> = data[..size]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        data = &data[size..];
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            return Err(bad(format!(
                "tensor '{}' holds {} at element {i}",
                t.name, values[i]
            )));
        }
        let map = match t.kind {
            Kind::Weight => &mut checkpoint.weights,
            Kind::Velocity => &mut checkpoint.velocity,
        };
        if map.insert(t.name.clone(), values).is_some() {
            return Err(bad(format!("tensor '{}' is listed twice", t.name)));
        }
    }
    if !data.is_empty() {
        return Err(bad(format!("{} bytes after the last tensor", data.len())));
    }
    Ok(checkpoint)
}

/// Checks `checkpoint` against the weights the model trains (`expected`: name → elements):
/// the same names, each of its size, momentum only for those; before any rank starts, so
/// a wrong checkpoint is an input error, not a run that waits out its timeout.
///
/// # Errors
/// The first difference, named.
pub fn check_against(
    checkpoint: &Checkpoint,
    expected: &BTreeMap<String, usize>,
) -> Result<(), String> {
    for (name, &len) in expected {
        match checkpoint.weights.get(name) {
            None => return Err(format!("it has no weight '{name}'")),
            Some(v) if v.len() != len => {
                return Err(format!(
                    "its weight '{name}' has {} elements, the model's {len}",
                    v.len()
                ))
            }
            Some(_) => {}
        }
    }
    for (kind, map) in [
        ("weight", &checkpoint.weights),
        ("momentum", &checkpoint.velocity),
    ] {
        for (name, v) in map {
            match expected.get(name) {
                None => return Err(format!("its {kind} '{name}' is not a weight of the model")),
                Some(&len) if len != v.len() => {
                    return Err(format!(
                        "its {kind} '{name}' has {} elements, the model's {len}",
                        v.len()
                    ))
                }
                Some(_) => {}
            }
        }
    }
    Ok(())
}
