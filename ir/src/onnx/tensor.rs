//! Decoding `TensorProto`s ourselves.
//!
//! onnx-protobuf's `TensorProto::as_value` ignores `raw_data` (which every PyTorch export
//! uses), mis-decodes small integer types and panics on others, so this reads the fields:
//! `raw_data` (little-endian) first, then the typed field the spec assigns to the element
//! type, or an external-data reference that is validated but not read.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use onnx_protobuf::tensor_proto::DataLocation;
use onnx_protobuf::TensorProto;

use crate::dtype::DType;
use crate::error::Problem;
use crate::tensor::{ExternalData, Storage, TensorData};

/// Where external data is resolved, with the sizes of the files already looked at (models
/// keep thousands of tensors in one file: it is stat'ed once).
#[derive(Default)]
pub(crate) struct ExternalFiles<'a> {
    /// The model's folder (`None` when the model came from memory).
    pub base: Option<&'a Path>,
    /// `None` for a missing file, else whether it is a regular file and its length.
    sizes: RefCell<HashMap<PathBuf, Option<(bool, u64)>>>,
}

impl<'a> ExternalFiles<'a> {
    pub(crate) fn new(base: Option<&'a Path>) -> ExternalFiles<'a> {
        ExternalFiles {
            base,
            sizes: RefCell::default(),
        }
    }

    fn size(&self, path: &Path) -> Option<(bool, u64)> {
        *self
            .sizes
            .borrow_mut()
            .entry(path.to_path_buf())
            .or_insert_with(|| std::fs::metadata(path).ok().map(|m| (m.is_file(), m.len())))
    }
}

/// Decodes a tensor, taking its bytes out of the proto.
pub(crate) fn decode(
    t: &mut TensorProto,
    files: &ExternalFiles<'_>,
) -> Result<TensorData, Problem> {
    let name = t.name.clone();
    let bad = |reason: String| Problem::Tensor {
        tensor: name.clone(),
        reason,
    };
    let dtype = DType::from_onnx(t.data_type)
        .ok_or_else(|| bad(format!("unsupported element type code {}", t.data_type)))?;
    let mut dims = Vec::with_capacity(t.dims.len());
    for &d in &t.dims {
        dims.push(u64::try_from(d).map_err(|_| bad(format!("negative dimension {d}")))?);
    }
    let numel = dims
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .ok_or_else(|| bad(format!("dimensions {:?} overflow", t.dims)))?;
    let size = numel
        .checked_mul(dtype.size_bytes())
        .ok_or_else(|| bad(format!("dimensions {:?} overflow", t.dims)))?;

    if t.data_location.enum_value() == Ok(DataLocation::EXTERNAL) {
        let ext = external(t, files, size)?;
        return Ok(TensorData {
            dtype,
            dims,
            storage: Storage::External(ext),
        });
    }
    if dtype == DType::String {
        // Strings never take part in shape arithmetic or parameters: keep only the shape.
        return Ok(TensorData {
            dtype,
            dims,
            storage: Storage::Inline(Arc::new(Vec::new())),
        });
    }
    let bytes = if !t.raw_data.is_empty() {
        std::mem::take(&mut t.raw_data)
    } else {
        typed_field_bytes(t, dtype)
    };
    if bytes.len() as u64 != size {
        return Err(bad(format!(
            "has {numel} element(s) of {dtype} ({size} bytes) but its data holds {} bytes",
            bytes.len()
        )));
    }
    Ok(TensorData {
        dtype,
        dims,
        storage: Storage::Inline(Arc::new(bytes)),
    })
}

/// The typed field's contents as little-endian bytes of `dtype`.
fn typed_field_bytes(t: &TensorProto, dtype: DType) -> Vec<u8> {
    match dtype {
        DType::F32 => t.float_data.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::F64 => t.double_data.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::I64 => t.int64_data.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::U64 => t.uint64_data.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::U32 => t
            .uint64_data
            .iter()
            .flat_map(|&v| (v as u32).to_le_bytes())
            .collect(),
        DType::I32 => t.int32_data.iter().flat_map(|v| v.to_le_bytes()).collect(),
        // The spec stores these in int32_data, one element per int32 (f16/bf16 as bits).
        DType::I16 => t
            .int32_data
            .iter()
            .flat_map(|&v| (v as i16).to_le_bytes())
            .collect(),
        DType::U16 | DType::F16 | DType::BF16 => t
            .int32_data
            .iter()
            .flat_map(|&v| (v as u16).to_le_bytes())
            .collect(),
        DType::I8 | DType::U8 | DType::Bool => t.int32_data.iter().map(|&v| v as u8).collect(),
        DType::String => Vec::new(),
    }
}

/// Validates an external-data reference. The file is only looked at (its size), never
/// read: a structure-only model whose data file is absent is valid for planning.
fn external(
    t: &TensorProto,
    files: &ExternalFiles<'_>,
    size: u64,
) -> Result<ExternalData, Problem> {
    let mut location = None;
    let mut offset = 0u64;
    let mut length = None;
    for kv in &t.external_data {
        let parse = |what: &str| {
            kv.value.parse::<u64>().map_err(|_| Problem::ExternalData {
                tensor: t.name.clone(),
                location: location.clone().unwrap_or_default(),
                reason: format!("{what} '{}' is not a non-negative integer", kv.value),
            })
        };
        match kv.key.as_str() {
            "location" => location = Some(kv.value.clone()),
            "offset" => offset = parse("offset")?,
            "length" => length = Some(parse("length")?),
            _ => {}
        }
    }
    let bad = |location: &str, reason: String| Problem::ExternalData {
        tensor: t.name.clone(),
        location: location.to_owned(),
        reason,
    };
    let location = location.ok_or_else(|| bad("", "the 'location' key is missing".into()))?;
    let rel = Path::new(&location);
    if location.is_empty()
        || rel.is_absolute()
        || location.starts_with('/')
        || location.starts_with('\\')
        || rel
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(bad(
            &location,
            "must be a relative path inside the model's folder (no absolute paths, no '..')".into(),
        ));
    }
    let length = length.unwrap_or(size);
    if length != size {
        return Err(bad(
            &location,
            format!("length {length} does not match the tensor's {size} bytes"),
        ));
    }
    let end = offset
        .checked_add(length)
        .ok_or_else(|| bad(&location, "offset + length overflows".into()))?;
    let path = files
        .base
        .map(|b| b.join(rel))
        .unwrap_or_else(|| rel.to_path_buf());
    // An absent file is fine (structure-only model); a present one must be inside the
    // model's folder once links are followed, and long enough.
    match crate::tensor::escapes_folder(&path, &location) {
        Ok(None) => {}
        Ok(Some(resolved)) => {
            return Err(bad(
                &location,
                format!(
                    "resolves to '{}', outside the model's folder (a symbolic link)",
                    resolved.display()
                ),
            ))
        }
        Err(e) => return Err(bad(&location, format!("cannot be resolved: {e}"))),
    }
    if let Some((is_file, len)) = files.size(&path) {
        if !is_file {
            return Err(bad(&location, "is not a regular file".into()));
        }
        if len < end {
            return Err(bad(
                &location,
                format!("file has {len} bytes, the tensor needs bytes {offset}..{end}"),
            ));
        }
    }
    Ok(ExternalData {
        location,
        path,
        offset,
        length,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use onnx_protobuf::StringStringEntryProto;

    fn ext_tensor(location: &str) -> TensorProto {
        let mut t = TensorProto::new();
        t.name = "w".into();
        t.data_type = 1;
        t.dims = vec![2, 3];
        t.data_location = DataLocation::EXTERNAL.into();
        let mut kv = StringStringEntryProto::new();
        kv.key = "location".into();
        kv.value = location.into();
        t.external_data.push(kv);
        t
    }

    #[test]
    fn external_paths_must_stay_inside_the_folder() {
        for bad in ["../w.bin", "/etc/passwd", "a/../../w.bin", ""] {
            let err = decode(
                &mut ext_tensor(bad),
                &ExternalFiles::new(Some(Path::new("/tmp"))),
            )
            .unwrap_err();
            assert!(matches!(err, Problem::ExternalData { .. }), "{bad}: {err}");
        }
        let ok = decode(
            &mut ext_tensor("sub/w.bin"),
            &ExternalFiles::new(Some(Path::new("/nonexistent"))),
        )
        .unwrap();
        assert!(matches!(ok.storage, Storage::External(ref e) if e.length == 24));
    }

    /// A data file, or a folder on its path, that is a symbolic link out of the model's
    /// folder is refused at import; one that stays inside is fine.
    #[cfg(unix)]
    #[test]
    fn links_out_of_the_folder_are_refused() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.bin"), [7u8; 24]).unwrap();
        let model = tempfile::tempdir().unwrap();
        let link = |target: &Path, name: &str| {
            std::os::unix::fs::symlink(target, model.path().join(name)).unwrap();
        };
        link(&outside.path().join("secret.bin"), "link.bin");
        link(outside.path(), "dir");
        std::fs::write(model.path().join("w.bin"), [0u8; 24]).unwrap();
        link(&model.path().join("w.bin"), "inside.bin");
        let files = ExternalFiles::new(Some(model.path()));
        for bad in ["link.bin", "dir/secret.bin"] {
            let err = decode(&mut ext_tensor(bad), &files)
                .unwrap_err()
                .to_string();
            assert!(err.contains("outside the model's folder"), "{bad}: {err}");
        }
        for good in ["w.bin", "inside.bin"] {
            decode(&mut ext_tensor(good), &files).unwrap();
        }
    }

    #[test]
    fn raw_and_typed_fields_agree() {
        let mut raw = TensorProto::new();
        raw.data_type = 7;
        raw.dims = vec![2];
        raw.raw_data = [3i64, -1].iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut typed = TensorProto::new();
        typed.data_type = 7;
        typed.dims = vec![2];
        typed.int64_data = vec![3, -1];
        assert_eq!(
            decode(&mut raw, &ExternalFiles::default()).unwrap(),
            decode(&mut typed, &ExternalFiles::default()).unwrap()
        );
    }

    #[test]
    fn size_mismatch_is_reported() {
        let mut t = TensorProto::new();
        t.name = "x".into();
        t.data_type = 1;
        t.dims = vec![4];
        t.float_data = vec![1.0];
        let err = decode(&mut t, &ExternalFiles::default())
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "tensor 'x': has 4 element(s) of f32 (16 bytes) but its data holds 4 bytes"
        );
    }
}
