//! Checkpoint files (`ralpc-checkpoint/4`): a run's training state between two steps,
//! written atomically by `ralpc run --checkpoint-every N` and read by `--resume`.
//!
//! A [safetensors](https://github.com/huggingface/safetensors) file, so PyTorch reads it
//! as it is (`safetensors.torch.load_file`):
//! * each trained weight under its name in the model (a PyTorch export keeps the module's
//!   parameter names: `features.0.weight`), in its shape, as `F32`;
//! * its SGD momentum buffer, once the weight has been updated, as `momentum/<name>`;
//! * `__metadata__` with one entry, `ralpc`: a JSON object with the format, the plan's
//!   inputs hash, the steps done, every step's loss, and a BLAKE3 hash of all of these and
//!   the tensor data (so an edited step or loss is found as surely as a flipped bit).
//!
//! ```text
//! {"format":"ralpc-checkpoint/4","plan":"<the plan's inputs hash>","step":3,
//!  "losses":[2.41,2.40,2.38],"blake3":"<hash of the bytes after the header>"}
//! ```
//!
//! The losses are stored with every digit (JSON round-trips `f64`), and the weights and
//! momentum buffers bit for bit, so a resumed run continues exactly where it stopped.
//! Reading checks the data's hash (a flipped bit), that the values are finite, and —
//! against the model — every trained weight's name and shape ([`check_against`]).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use ralpc_ir::input::{read_input, InputKind};
use ralpc_runtime_min::cpu::exec::Checkpoint;
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use serde::{Deserialize, Serialize};

use crate::error::{Error, FileError};

/// The format tag.
pub const FORMAT: &str = "ralpc-checkpoint/4";

/// The `__metadata__` key holding [`State`].
const KEY: &str = "ralpc";

/// Where a momentum buffer's name starts.
const MOMENTUM: &str = "momentum/";

/// What a checkpoint says besides its tensors.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct State {
    format: String,
    plan: String,
    step: u32,
    losses: Vec<f64>,
    /// [`digest`] of the rest of the state and the tensor data, hex.
    blake3: String,
}

/// blake3 of everything a checkpoint says: its format, plan, step and losses (each
/// length-prefixed, the losses bit for bit) and its tensor data (everything after the
/// safetensors header).
fn digest(state: &State, data: &[u8]) -> String {
    let mut hasher = blake3::Hasher::new();
    for text in [&state.format, &state.plan] {
        hasher.update(&(text.len() as u64).to_le_bytes());
        hasher.update(text.as_bytes());
    }
    hasher.update(&state.step.to_le_bytes());
    hasher.update(&(state.losses.len() as u64).to_le_bytes());
    for loss in &state.losses {
        hasher.update(&loss.to_bits().to_le_bytes());
    }
    hasher.update(data);
    hasher.finalize().to_hex().to_string()
}

/// Writes `checkpoint` of the plan whose inputs hash is `plan` to `path`, atomically, each
/// weight in its shape in `shapes` (name → dims; a flat vector when absent).
///
/// # Errors
/// [`Error::Write`] when the file cannot be written.
pub fn write(
    path: &Path,
    plan: &str,
    checkpoint: &Checkpoint,
    shapes: &BTreeMap<String, Vec<usize>>,
) -> Result<(), Error> {
    let bytes = to_bytes(plan, checkpoint, shapes)
        .map_err(|e| Error::Checkpoint(Box::new(format!("{}: {e}", path.display()))))?;
    crate::output::write_bytes_atomically(path, &bytes)
}

/// What makes a checkpoint's bytes unusable, or a checkpoint not the plan's (or, writing
/// one, tensors safetensors cannot serialize): reported as [`Error::Checkpoint`] with the
/// file's path.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unusable(String);

/// The file's bytes: the tensors serialized once to hash their data, then with the hash.
fn to_bytes(
    plan: &str,
    checkpoint: &Checkpoint,
    shapes: &BTreeMap<String, Vec<usize>>,
) -> Result<Vec<u8>, Unusable> {
    let mut raw: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (prefix, map) in [("", &checkpoint.weights), (MOMENTUM, &checkpoint.velocity)] {
        for (name, values) in map {
            let shape = shapes
                .get(name)
                .filter(|s| s.iter().product::<usize>() == values.len())
                .cloned()
                .unwrap_or_else(|| vec![values.len()]);
            let data = values.iter().flat_map(|x| x.to_le_bytes()).collect();
            raw.push((format!("{prefix}{name}"), shape, data));
        }
    }
    let serialize = |state: &State| -> Result<Vec<u8>, Unusable> {
        let views = raw
            .iter()
            .map(|(name, shape, data)| {
                TensorView::new(Dtype::F32, shape.clone(), data)
                    .map(|v| (name.as_str(), v))
                    .map_err(|e| Unusable(format!("tensor '{name}': {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        // One metadata entry: a map of several would be written in hash order.
        let json = serde_json::to_string(state).map_err(|e| Unusable(e.to_string()))?;
        let metadata = HashMap::from([(KEY.to_owned(), json)]);
        safetensors::serialize(views, Some(metadata)).map_err(|e| Unusable(e.to_string()))
    };
    let mut state = State {
        format: FORMAT.to_owned(),
        plan: plan.to_owned(),
        step: checkpoint.step,
        losses: checkpoint.losses.clone(),
        blake3: String::new(),
    };
    // The header's length does not depend on the hash's value: hash the data of a first
    // serialization (with a placeholder of the same length), then write the real one.
    state.blake3 = "0".repeat(64);
    let draft = serialize(&state)?;
    state.blake3 = digest(&state, data_of(&draft)?);
    serialize(&state)
}

/// The tensor data of a safetensors file: everything after its header.
fn data_of(bytes: &[u8]) -> Result<&[u8], Unusable> {
    let n = bytes
        .get(..8)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_le_bytes)
        .ok_or_else(|| Unusable("shorter than a safetensors header".to_owned()))?;
    usize::try_from(n)
        .ok()
        .and_then(|n| n.checked_add(8))
        .and_then(|start| bytes.get(start..))
        .ok_or_else(|| Unusable("its header runs past the end of the file".to_owned()))
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
    let (_, metadata) = SafeTensors::read_metadata(&bytes)
        .map_err(|e| bad(format!("not a safetensors file ({e})")))?;
    let state = metadata
        .metadata()
        .as_ref()
        .and_then(|m| m.get(KEY))
        .ok_or_else(|| {
            bad(format!(
                "no '{KEY}' entry in its metadata: not a ralpc checkpoint"
            ))
        })?;
    let state: State =
        serde_json::from_str(state).map_err(|e| bad(format!("its '{KEY}' metadata: {e}")))?;
    if state.format != FORMAT {
        return Err(bad(format!(
            "format is \"{}\"; this ralpc reads \"{FORMAT}\"",
            state.format
        )));
    }
    if state.plan != plan {
        return Err(bad(
            "it was written by a run of another plan (its inputs hash differs)".into(),
        ));
    }
    if state.losses.len() != state.step as usize {
        return Err(bad(format!(
            "{} losses for {} steps",
            state.losses.len(),
            state.step
        )));
    }
    let data = data_of(&bytes).map_err(|Unusable(m)| bad(m))?;
    if digest(&state, data) != state.blake3 {
        return Err(bad(
            "its step, losses or values do not match their hash: the file was changed after \
             it was written"
                .into(),
        ));
    }
    let tensors = SafeTensors::deserialize(&bytes)
        .map_err(|e| bad(format!("not a safetensors file ({e})")))?;
    let mut checkpoint = Checkpoint {
        step: state.step,
        losses: state.losses,
        weights: BTreeMap::new(),
        velocity: BTreeMap::new(),
    };
    let mut names = tensors.names();
    names.sort_unstable();
    for name in names {
        let t = tensors
            .tensor(name)
            .map_err(|e| bad(format!("tensor '{name}': {e}")))?;
        if t.dtype() != Dtype::F32 {
            return Err(bad(format!("tensor '{name}' is {:?}, not F32", t.dtype())));
        }
        let values: Vec<f32> = t
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            return Err(bad(format!(
                "tensor '{name}' holds {} at element {i}",
                values[i]
            )));
        }
        match name.strip_prefix(MOMENTUM) {
            Some(weight) => checkpoint.velocity.insert(weight.to_owned(), values),
            None => checkpoint.weights.insert(name.to_owned(), values),
        };
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
) -> Result<(), Unusable> {
    for (name, &len) in expected {
        match checkpoint.weights.get(name) {
            None => return Err(Unusable(format!("it has no weight '{name}'"))),
            Some(v) if v.len() != len => {
                return Err(Unusable(format!(
                    "its weight '{name}' has {} elements, the model's {len}",
                    v.len()
                )))
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
                None => {
                    return Err(Unusable(format!(
                        "its {kind} '{name}' is not a weight of the model"
                    )))
                }
                Some(&len) if len != v.len() => {
                    return Err(Unusable(format!(
                        "its {kind} '{name}' has {} elements, the model's {len}",
                        v.len()
                    )))
                }
                Some(_) => {}
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (Checkpoint, BTreeMap<String, Vec<usize>>) {
        let checkpoint = Checkpoint {
            step: 2,
            losses: vec![std::f64::consts::LN_10, 2.1],
            weights: BTreeMap::from([
                (
                    "fc.weight".to_owned(),
                    vec![0.5, -1.25, 3.0, 0.0, 1e-30, -7.5],
                ),
                ("fc.bias".to_owned(), vec![0.1, 0.2]),
            ]),
            velocity: BTreeMap::from([("fc.bias".to_owned(), vec![-0.01, 0.02])]),
        };
        let shapes = BTreeMap::from([
            ("fc.weight".to_owned(), vec![2, 3]),
            ("fc.bias".to_owned(), vec![2]),
        ]);
        (checkpoint, shapes)
    }

    #[test]
    fn a_checkpoint_reads_back_bit_for_bit_and_writes_the_same_bytes_every_time() {
        let (checkpoint, shapes) = sample();
        let bytes = to_bytes("plan-hash", &checkpoint, &shapes).expect("serialize");
        for _ in 0..5 {
            assert_eq!(
                to_bytes("plan-hash", &checkpoint, &shapes).expect("serialize"),
                bytes
            );
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("c.safetensors");
        std::fs::write(&path, &bytes).expect("write");
        let back = read(&path, "plan-hash").expect("read");
        assert_eq!(back.step, 2);
        assert_eq!(back.losses, checkpoint.losses);
        assert_eq!(back.weights, checkpoint.weights);
        assert_eq!(back.velocity, checkpoint.velocity);
        let file = SafeTensors::deserialize(&bytes).expect("safetensors");
        assert_eq!(file.tensor("fc.weight").expect("a weight").shape(), [2, 3]);
        assert!(read(&path, "another plan").is_err());
    }

    /// The step and the losses are inside the hash: a checkpoint edited to claim more
    /// steps, or other losses, is refused (the JSON is edited in place, same length).
    #[test]
    fn an_edited_step_or_loss_is_refused() {
        let (checkpoint, shapes) = sample();
        let bytes = to_bytes("plan-hash", &checkpoint, &shapes).expect("serialize");
        let dir = tempfile::tempdir().expect("temp dir");
        let header_end = 8 + u64::from_le_bytes(bytes[..8].try_into().expect("8")) as usize;
        let header = std::str::from_utf8(&bytes[8..header_end]).expect("a JSON header");
        for (from, to) in [("\\\"step\\\":2", "\\\"step\\\":1"), ("2.1]", "2.0]")] {
            assert!(header.contains(from), "{from} in {header}");
            let edited = header.replacen(from, to, 1);
            let mut edited_bytes = bytes.clone();
            edited_bytes[8..header_end].copy_from_slice(edited.as_bytes());
            let path = dir.path().join("edited.safetensors");
            std::fs::write(&path, &edited_bytes).expect("write");
            let err = read(&path, "plan-hash").unwrap_err().to_string();
            assert!(
                err.contains("do not match their hash") || err.contains("losses for"),
                "{err}"
            );
        }
    }
}
