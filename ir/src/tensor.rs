//! Constant tensors: initializers and `Constant` payloads.
//!
//! Bytes are kept as ONNX stores them, little-endian; weights stored as external data stay
//! on disk until something asks for them, so a model whose `.data` file is absent still
//! imports, verifies and plans. Only shape arithmetic (small integer tensors) and execution
//! read the bytes.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::dtype::DType;

/// A constant tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorData {
    /// Element type.
    pub dtype: DType,
    /// Dimensions (all known for a constant).
    pub dims: Vec<u64>,
    /// Where the bytes are.
    pub storage: Storage,
}

/// Where a constant's bytes live.
#[derive(Clone, Debug, PartialEq)]
pub enum Storage {
    /// In the model file (ONNX `raw_data` or typed fields), little-endian.
    Inline(Arc<Vec<u8>>),
    /// In a file beside the model (ONNX external data).
    External(ExternalData),
}

/// A tensor stored outside the model file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExternalData {
    /// `location` as written in the model.
    pub location: String,
    /// The resolved path (the model's folder joined with `location`).
    pub path: PathBuf,
    /// Byte offset in the file.
    pub offset: u64,
    /// Byte length (the tensor's size when the model does not say).
    pub length: u64,
}

/// Why a tensor's bytes could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TensorReadError {
    /// The external data file could not be opened or mapped.
    #[error("cannot read external data '{}'", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file resolves (through a symbolic link) outside the model's folder.
    #[error("external data '{}' resolves to '{}', outside the model's folder", path.display(), resolved.display())]
    OutsideFolder {
        /// The file as the model names it.
        path: PathBuf,
        /// Where it resolves to.
        resolved: PathBuf,
    },
    /// The file is shorter than `offset + length`.
    #[error("external data '{}' has {file_len} bytes, the tensor needs bytes {offset}..{end}", path.display())]
    OutOfRange {
        /// The file.
        path: PathBuf,
        /// Its size.
        file_len: u64,
        /// Requested start.
        offset: u64,
        /// Requested end.
        end: u64,
    },
    /// The element type cannot be read as numbers.
    #[error("tensor of type {dtype} cannot be read as numbers")]
    NotNumeric {
        /// The type.
        dtype: DType,
    },
}

impl TensorData {
    /// Number of elements; `None` on overflow.
    pub fn numel(&self) -> Option<u64> {
        self.dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
    }

    /// Size in bytes; `None` on overflow.
    pub fn size_bytes(&self) -> Option<u64> {
        self.numel()?.checked_mul(self.dtype.size_bytes())
    }

    /// The tensor's bytes, reading (memory-mapping) external data if needed.
    ///
    /// # Errors
    /// When the external file is missing, unreadable or too short.
    pub fn bytes(&self) -> Result<std::borrow::Cow<'_, [u8]>, TensorReadError> {
        match &self.storage {
            Storage::Inline(bytes) => Ok(std::borrow::Cow::Borrowed(bytes.as_slice())),
            Storage::External(ext) => read_external(ext).map(std::borrow::Cow::Owned),
        }
    }

    /// The elements as `f64`, for numeric types.
    ///
    /// # Errors
    /// As [`TensorData::bytes`], or for string tensors.
    pub fn to_f64s(&self) -> Result<Vec<f64>, TensorReadError> {
        let bytes = self.bytes()?;
        decode_f64s(self.dtype, &bytes)
    }
}

/// `path` — the model's folder joined with the relative `location` — resolved, symbolic
/// links followed: `Ok(None)` inside the folder (or absent), `Ok(Some(resolved))` outside.
///
/// # Errors
/// The folder or the file cannot be resolved.
pub(crate) fn escapes_folder(path: &Path, location: &str) -> std::io::Result<Option<PathBuf>> {
    if std::fs::symlink_metadata(path).is_err() {
        return Ok(None);
    }
    let depth = Path::new(location).components().count();
    let Some(folder) = path.ancestors().nth(depth) else {
        return Ok(None);
    };
    let folder = if folder.as_os_str().is_empty() {
        Path::new(".")
    } else {
        folder
    };
    let (folder, resolved) = (folder.canonicalize()?, path.canonicalize()?);
    Ok((!resolved.starts_with(&folder)).then_some(resolved))
}

fn read_external(ext: &ExternalData) -> Result<Vec<u8>, TensorReadError> {
    let io = |source| TensorReadError::Io {
        path: ext.path.clone(),
        source,
    };
    // Checked again here, not only at import: the folder may have changed since.
    if let Some(resolved) = escapes_folder(&ext.path, &ext.location).map_err(io)? {
        return Err(TensorReadError::OutsideFolder {
            path: ext.path.clone(),
            resolved,
        });
    }
    let file = std::fs::File::open(&ext.path).map_err(io)?;
    let file_len = file.metadata().map_err(io)?.len();
    let end = ext.offset.saturating_add(ext.length);
    if end > file_len {
        return Err(TensorReadError::OutOfRange {
            path: ext.path.clone(),
            file_len,
            offset: ext.offset,
            end,
        });
    }
    if ext.length == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: the map is read-only and copied out before it is dropped; a concurrent
    // truncation of the file by another process is the documented hazard of mmap and would
    // fault, which is why the bytes are copied instead of borrowed for long.
    let map = unsafe { memmap2::MmapOptions::new().map(&file) }.map_err(io)?;
    let (start, end) = (ext.offset as usize, end as usize);
    Ok(map[start..end].to_vec())
}

/// Decodes little-endian bytes of `dtype` into `f64`s.
pub(crate) fn decode_f64s(dtype: DType, bytes: &[u8]) -> Result<Vec<f64>, TensorReadError> {
    fn each<const N: usize>(bytes: &[u8], f: impl Fn([u8; N]) -> f64) -> Vec<f64> {
        bytes
            .chunks_exact(N)
            .map(|c| {
                let mut a = [0u8; N];
                a.copy_from_slice(c);
                f(a)
            })
            .collect()
    }
    Ok(match dtype {
        DType::F32 => each(bytes, |b| f32::from_le_bytes(b) as f64),
        DType::F64 => each(bytes, f64::from_le_bytes),
        DType::F16 => each(bytes, |b| f16_to_f32(u16::from_le_bytes(b)) as f64),
        DType::BF16 => each(bytes, |b| {
            f32::from_bits((u16::from_le_bytes(b) as u32) << 16) as f64
        }),
        DType::I8 => each(bytes, |b: [u8; 1]| b[0] as i8 as f64),
        DType::U8 | DType::Bool => each(bytes, |b: [u8; 1]| b[0] as f64),
        DType::I16 => each(bytes, |b| i16::from_le_bytes(b) as f64),
        DType::U16 => each(bytes, |b| u16::from_le_bytes(b) as f64),
        DType::I32 => each(bytes, |b| i32::from_le_bytes(b) as f64),
        DType::U32 => each(bytes, |b| u32::from_le_bytes(b) as f64),
        DType::I64 => each(bytes, |b| i64::from_le_bytes(b) as f64),
        DType::U64 => each(bytes, |b| u64::from_le_bytes(b) as f64),
        DType::String => return Err(TensorReadError::NotNumeric { dtype }),
    })
}

/// Decodes little-endian integer (or boolean) bytes into `i64`s; floats are truncated.
pub(crate) fn decode_i64s(dtype: DType, bytes: &[u8]) -> Result<Vec<i64>, TensorReadError> {
    if dtype == DType::I64 {
        return Ok(bytes
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect());
    }
    Ok(decode_f64s(dtype, bytes)?
        .into_iter()
        .map(|v| v as i64)
        .collect())
}

/// IEEE half to single precision.
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let frac = (h & 0x3ff) as u32;
    let bits = match (exp, frac) {
        (0, 0) => sign,
        (0, _) => {
            // Subnormal: normalize.
            let mut e = 127 - 15 + 1;
            let mut f = frac;
            while f & 0x400 == 0 {
                f <<= 1;
                e -= 1;
            }
            sign | ((e as u32) << 23) | ((f & 0x3ff) << 13)
        }
        (0x1f, _) => sign | 0x7f80_0000 | (frac << 13),
        _ => sign | ((exp + 127 - 15) << 23) | (frac << 13),
    };
    f32::from_bits(bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_precision() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x0001), 5.960_464_5e-8);
        assert!(f16_to_f32(0x7e00).is_nan());
    }

    #[test]
    fn missing_external_file_is_an_error_not_a_panic() {
        let t = TensorData {
            dtype: DType::F32,
            dims: vec![2],
            storage: Storage::External(ExternalData {
                location: "w.bin".into(),
                path: "/nonexistent/w.bin".into(),
                offset: 0,
                length: 8,
            }),
        };
        assert!(matches!(t.bytes(), Err(TensorReadError::Io { .. })));
    }
}
