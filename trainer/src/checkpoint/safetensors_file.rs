//! The safetensors format, written deterministically and read with dtype conversion.
//!
//! Layout written: 8-byte little-endian header length, a JSON header whose first entry is
//! `__metadata__` followed by the tensors in name order, padded with spaces to a multiple of 8
//! (as the Python writer does), then the tensors' little-endian bytes in the same order.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use candle_core::safetensors::{Load, SliceSafetensors};
use candle_core::{DType, Device, Tensor};

use super::CheckpointError;
use super::error::{io, tensor};

fn dtype_name(dtype: DType) -> Option<&'static str> {
    Some(match dtype {
        DType::F32 => "F32",
        DType::BF16 => "BF16",
        DType::F16 => "F16",
        DType::F64 => "F64",
        DType::I64 => "I64",
        DType::I32 => "I32",
        DType::I16 => "I16",
        DType::U32 => "U32",
        DType::U8 => "U8",
        DType::F8E4M3 => "F8_E4M3",
        _ => return None,
    })
}

/// The dtype a safetensors dtype name stands for, among those [`dtype_name`] writes.
pub(super) fn dtype_of(name: &str) -> Option<DType> {
    [DType::F32, DType::BF16, DType::F16, DType::F64, DType::I64, DType::I32, DType::I16, DType::U32, DType::U8]
        .into_iter()
        .find(|d| dtype_name(*d) == Some(name))
}

/// Streams `tensors` (converted to `dtype` when given) as one safetensors file into `out`.
/// Returns the number of bytes written.
pub(super) fn write_safetensors<W: Write + ?Sized>(
    out: &mut W,
    tensors: &[(&str, &Tensor)],
    dtype: Option<DType>,
    metadata: &BTreeMap<String, String>,
) -> Result<u64, CheckpointError> {
    let mut sorted: Vec<(&str, &Tensor)> = tensors.to_vec();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    if let Some(w) = sorted.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(CheckpointError::BadAdapterTensor { name: w[0].0.to_string(), reason: "written twice".into() });
    }

    let mut entries = Vec::with_capacity(sorted.len());
    for (name, t) in &sorted {
        let dt = dtype.unwrap_or(t.dtype());
        let dt_name = dtype_name(dt).ok_or_else(|| CheckpointError::Tensor {
            name: name.to_string(),
            source: candle_core::Error::Msg(format!("dtype {dt:?} cannot be saved")),
        })?;
        entries.push((*name, dt_name, t.dims(), (t.elem_count() * dt.size_in_bytes()) as u64));
    }
    let (header, offset) = header(metadata, &entries);
    let werr = |e: std::io::Error| CheckpointError::Io { path: "<safetensors stream>".into(), source: e };
    out.write_all(&(header.len() as u64).to_le_bytes()).map_err(werr)?;
    out.write_all(header.as_bytes()).map_err(werr)?;
    for (name, t) in &sorted {
        let t = match dtype {
            Some(dt) if dt != t.dtype() => t.to_dtype(dt).map_err(tensor(name))?,
            _ => (*t).clone(),
        };
        out.write_all(&le_bytes(&t).map_err(tensor(name))?).map_err(werr)?;
    }
    Ok(8 + header.len() as u64 + offset)
}

/// A safetensors header over `entries` (name, dtype name, shape, byte length; in name order):
/// `__metadata__` first, padded with spaces to a multiple of 8. Returns it and the data's length.
fn header(metadata: &BTreeMap<String, String>, entries: &[(&str, &str, &[usize], u64)]) -> (String, u64) {
    let json = |s: &str| serde_json::to_string(s).expect("strings always serialize");
    let mut header = String::from("{\"__metadata__\":{");
    for (i, (k, v)) in metadata.iter().enumerate() {
        header += &format!("{}{}:{}", if i > 0 { "," } else { "" }, json(k), json(v));
    }
    header.push('}');
    let mut offset = 0u64;
    for (name, dt_name, dims, len) in entries {
        let shape: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
        header += &format!(
            ",{}:{{\"dtype\":\"{dt_name}\",\"shape\":[{}],\"data_offsets\":[{offset},{}]}}",
            json(name),
            shape.join(","),
            offset + len
        );
        offset += len;
    }
    header.push('}');
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    (header, offset)
}

/// A tensor as stored: its safetensors dtype name, shape and little-endian bytes.
pub(super) struct RawTensor<'a> {
    pub dtype: String,
    pub shape: Vec<usize>,
    pub bytes: std::borrow::Cow<'a, [u8]>,
}

/// Streams `tensors` as stored (no decoding: bytes copied from another file keep every bit) as
/// one safetensors file into `out`, laid out as [`write_safetensors`] lays it out.
pub(super) fn write_raw_safetensors<W: Write + ?Sized>(
    out: &mut W,
    tensors: &BTreeMap<String, RawTensor<'_>>,
    metadata: &BTreeMap<String, String>,
) -> Result<(), CheckpointError> {
    let entries: Vec<_> =
        tensors.iter().map(|(n, t)| (n.as_str(), t.dtype.as_str(), t.shape.as_slice(), t.bytes.len() as u64)).collect();
    let (header, _) = header(metadata, &entries);
    let werr = |e: std::io::Error| CheckpointError::Io { path: "<safetensors stream>".into(), source: e };
    out.write_all(&(header.len() as u64).to_le_bytes()).map_err(werr)?;
    out.write_all(header.as_bytes()).map_err(werr)?;
    for t in tensors.values() {
        out.write_all(&t.bytes).map_err(werr)?;
    }
    Ok(())
}

/// `t`'s little-endian bytes as `dtype` (a float tensor re-encoded in a stored file's dtype).
pub(super) fn encode(t: &Tensor, dtype: DType) -> candle_core::Result<Vec<u8>> {
    le_bytes(&t.to_dtype(dtype)?)
}

/// The bytes of the safetensors file [`write_safetensors`] would write.
pub fn safetensors_bytes(
    tensors: &BTreeMap<String, Tensor>,
    dtype: Option<DType>,
    metadata: &BTreeMap<String, String>,
) -> Result<Vec<u8>, CheckpointError> {
    let mut out = Vec::new();
    let list: Vec<(&str, &Tensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    write_safetensors(&mut out, &list, dtype, metadata)?;
    Ok(out)
}

fn le_bytes(t: &Tensor) -> candle_core::Result<Vec<u8>> {
    let t = t.flatten_all()?;
    macro_rules! bytes {
        ($ty:ty) => {
            t.to_vec1::<$ty>()?.iter().flat_map(|x| x.to_le_bytes()).collect()
        };
    }
    Ok(match t.dtype() {
        DType::F32 => bytes!(f32),
        DType::F64 => bytes!(f64),
        DType::BF16 => bytes!(half::bf16),
        DType::F16 => bytes!(half::f16),
        DType::I64 => bytes!(i64),
        DType::I32 => bytes!(i32),
        DType::I16 => bytes!(i16),
        DType::U32 => bytes!(u32),
        DType::U8 => t.to_vec1::<u8>()?,
        DType::F8E4M3 => t.to_vec1::<float8::F8E4M3>()?.iter().map(|x| x.to_bits()).collect(),
        other => return Err(candle_core::Error::Msg(format!("dtype {other:?} cannot be saved"))),
    })
}

/// A parsed safetensors file held in memory.
pub(super) struct SafetensorsFile {
    bytes: Vec<u8>,
}

impl SafetensorsFile {
    pub(super) fn read(path: &Path) -> Result<Self, CheckpointError> {
        let bytes = std::fs::read(path).map_err(io(path))?;
        SliceSafetensors::new(&bytes)
            .map_err(|e| CheckpointError::BadSafetensors { path: path.to_path_buf(), reason: e.to_string() })?;
        Ok(SafetensorsFile { bytes })
    }

    fn parsed(&self) -> SliceSafetensors<'_> {
        SliceSafetensors::new(&self.bytes).expect("validated in read")
    }

    /// (name, shape, dtype) of every tensor, in name order.
    pub(super) fn entries(&self) -> Vec<(String, Vec<usize>, Result<DType, String>)> {
        let mut out: Vec<_> = self
            .parsed()
            .tensors()
            .into_iter()
            .map(|(name, v)| {
                (name, v.shape().to_vec(), DType::try_from(v.dtype()).map_err(|_| format!("{:?}", v.dtype())))
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Loads one float tensor (bf16/f16/f32/f64) as `dtype` on `device`.
    pub(super) fn load_float(
        &self,
        path: &Path,
        name: &str,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor, CheckpointError> {
        let st = self.parsed();
        let view = st
            .get(name)
            .map_err(|_| CheckpointError::MissingTensor { name: name.to_string(), file: path.to_path_buf() })?;
        let stored = DType::try_from(view.dtype()).ok().filter(|d| d.is_float() && dtype_name(*d).is_some());
        if DType::try_from(view.dtype()).ok() == Some(DType::F8E4M3) {
            return Err(CheckpointError::QuantizedWeights { name: name.to_string(), file: path.to_path_buf() });
        }
        if stored.is_none() {
            return Err(CheckpointError::UnsupportedDtype {
                name: name.to_string(),
                file: path.to_path_buf(),
                dtype: format!("{:?}", view.dtype()),
            });
        }
        let t = view.load(&Device::Cpu).map_err(tensor(name))?;
        t.to_dtype(dtype).and_then(|t| t.to_device(device)).map_err(tensor(name))
    }

    /// Every tensor as stored, by name, its bytes borrowed from the file (read by the header's
    /// offsets, which [`SafetensorsFile::read`] validated).
    pub(super) fn raw_tensors(&self, path: &Path) -> Result<BTreeMap<String, RawTensor<'_>>, CheckpointError> {
        #[derive(serde::Deserialize)]
        struct Entry {
            dtype: String,
            shape: Vec<usize>,
            data_offsets: [usize; 2],
        }
        let bad = |reason: String| CheckpointError::BadSafetensors { path: path.to_path_buf(), reason };
        let len = u64::from_le_bytes(self.bytes[..8].try_into().expect("validated in read")) as usize;
        let mut header: BTreeMap<String, serde_json::Value> =
            serde_json::from_slice(&self.bytes[8..8 + len]).map_err(|e| bad(e.to_string()))?;
        header.remove("__metadata__");
        let data = &self.bytes[8 + len..];
        header
            .into_iter()
            .map(|(name, v)| {
                let e: Entry = serde_json::from_value(v).map_err(|e| bad(format!("`{name}`: {e}")))?;
                let [start, end] = e.data_offsets;
                let bytes = data.get(start..end).ok_or_else(|| bad(format!("`{name}`: offsets out of the file")))?;
                Ok((name, RawTensor { dtype: e.dtype, shape: e.shape, bytes: std::borrow::Cow::Borrowed(bytes) }))
            })
            .collect()
    }

    /// Loads one tensor as stored.
    pub(super) fn load_raw(&self, path: &Path, name: &str) -> Result<Tensor, CheckpointError> {
        let st = self.parsed();
        let view = st
            .get(name)
            .map_err(|_| CheckpointError::MissingTensor { name: name.to_string(), file: path.to_path_buf() })?;
        view.load(&Device::Cpu).map_err(tensor(name))
    }
}

/// Every tensor of a safetensors file, as stored (`dtype: None`) or converted.
pub fn read_safetensors(
    path: &Path,
    dtype: Option<DType>,
    device: &Device,
) -> Result<BTreeMap<String, Tensor>, CheckpointError> {
    let file = SafetensorsFile::read(path)?;
    let mut out = BTreeMap::new();
    for (name, _, _) in file.entries() {
        let t = match dtype {
            Some(dt) => file.load_float(path, &name, dt, device)?,
            None => file.load_raw(path, &name)?.to_device(device).map_err(tensor(&name))?,
        };
        out.insert(name, t);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> BTreeMap<String, String> {
        BTreeMap::from([("format".to_string(), "pt".to_string())])
    }

    #[test]
    fn header_is_sorted_padded_and_parses() {
        let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0], 3, &Device::Cpu).unwrap();
        let b = Tensor::from_slice(&[7i64], (1, 1), &Device::Cpu).unwrap();
        let map = BTreeMap::from([("z.w".to_string(), a), ("a.b".to_string(), b)]);
        let bytes = safetensors_bytes(&map, None, &meta()).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        assert_eq!(n % 8, 0);
        let header = std::str::from_utf8(&bytes[8..8 + n]).unwrap();
        assert!(
            header.starts_with(
                r#"{"__metadata__":{"format":"pt"},"a.b":{"dtype":"I64","shape":[1,1],"data_offsets":[0,8]},"z.w":"#
            ),
            "{header}"
        );
        assert_eq!(bytes.len(), 8 + n + 8 + 12);
        let st = SliceSafetensors::new(&bytes).unwrap();
        assert_eq!(st.load("z.w", &Device::Cpu).unwrap().to_vec1::<f32>().unwrap(), [1.0, 2.0, 3.0]);
    }

    #[test]
    fn same_tensors_same_bytes_and_conversion_applies() {
        let t = Tensor::from_slice(&[0.5f32, -1.25], 2, &Device::Cpu).unwrap();
        let one =
            safetensors_bytes(&BTreeMap::from([("w".to_string(), t.clone())]), Some(DType::BF16), &meta()).unwrap();
        let two = safetensors_bytes(&BTreeMap::from([("w".to_string(), t)]), Some(DType::BF16), &meta()).unwrap();
        assert_eq!(one, two);
        let st = SliceSafetensors::new(&one).unwrap();
        let back = st.load("w", &Device::Cpu).unwrap();
        assert_eq!(back.dtype(), DType::BF16);
        assert_eq!(back.to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap(), [0.5, -1.25]);
    }
}
