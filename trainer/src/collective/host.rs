//! Tensors as host bytes for the TCP mesh: copied out once, summed in their own dtype with the
//! rounding candle's CPU ops use (bf16 and f16 add in f32 and round once), copied back.

use candle_core::{DType, Device, Tensor};
use half::{bf16, f16};

use super::CollectiveError;

/// A flat buffer in one of the dtypes collectives carry.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum HostBuf {
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bf16(Vec<bf16>),
    F16(Vec<f16>),
}

// The wire is little-endian; the element bytes are sent as they lie in memory.
#[cfg(not(target_endian = "little"))]
compile_error!("the TCP mesh sends element bytes as they are in memory: little-endian hosts only");

/// Plain-old-data element types: any byte pattern is a value, no padding.
trait Pod: Copy + Default {}
impl Pod for f32 {}
impl Pod for f64 {}
impl Pod for bf16 {}
impl Pod for f16 {}

fn bytes_of<T: Pod>(v: &[T]) -> &[u8] {
    // SAFETY: T is plain old data (no padding, no invalid patterns); the view covers exactly the
    // slice's memory and lives no longer than the borrow.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

fn bytes_of_mut<T: Pod>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: as above; every byte pattern written through the view is a valid T.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

impl HostBuf {
    /// The flat values of `t` on the host.
    pub fn from_tensor(t: &Tensor) -> Result<HostBuf, CollectiveError> {
        settle(t.device())?;
        let t = t.flatten_all()?.to_device(&Device::Cpu)?;
        Ok(match t.dtype() {
            DType::F32 => HostBuf::F32(t.to_vec1()?),
            DType::F64 => HostBuf::F64(t.to_vec1()?),
            DType::BF16 => HostBuf::Bf16(t.to_vec1()?),
            DType::F16 => HostBuf::F16(t.to_vec1()?),
            other => return Err(CollectiveError::Tensor(format!("collectives carry floats, not {other:?}"))),
        })
    }

    /// Zeros of `dtype`, `n` long.
    pub fn zeros(dtype: DType, n: usize) -> Result<HostBuf, CollectiveError> {
        Ok(match dtype {
            DType::F32 => HostBuf::F32(vec![0.0; n]),
            DType::F64 => HostBuf::F64(vec![0.0; n]),
            DType::BF16 => HostBuf::Bf16(vec![bf16::ZERO; n]),
            DType::F16 => HostBuf::F16(vec![f16::ZERO; n]),
            other => return Err(CollectiveError::Tensor(format!("collectives carry floats, not {other:?}"))),
        })
    }

    pub fn dtype(&self) -> DType {
        match self {
            HostBuf::F32(_) => DType::F32,
            HostBuf::F64(_) => DType::F64,
            HostBuf::Bf16(_) => DType::BF16,
            HostBuf::F16(_) => DType::F16,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            HostBuf::F32(v) => v.len(),
            HostBuf::F64(v) => v.len(),
            HostBuf::Bf16(v) => v.len(),
            HostBuf::F16(v) => v.len(),
        }
    }

    pub fn elem_size(&self) -> usize {
        self.dtype().size_in_bytes()
    }

    /// Elements `[start, start + n)` as bytes.
    pub fn bytes(&self, start: usize, n: usize) -> &[u8] {
        match self {
            HostBuf::F32(v) => bytes_of(&v[start..start + n]),
            HostBuf::F64(v) => bytes_of(&v[start..start + n]),
            HostBuf::Bf16(v) => bytes_of(&v[start..start + n]),
            HostBuf::F16(v) => bytes_of(&v[start..start + n]),
        }
    }

    /// Elements `[start, start + n)` as writable bytes.
    pub fn bytes_mut(&mut self, start: usize, n: usize) -> &mut [u8] {
        match self {
            HostBuf::F32(v) => bytes_of_mut(&mut v[start..start + n]),
            HostBuf::F64(v) => bytes_of_mut(&mut v[start..start + n]),
            HostBuf::Bf16(v) => bytes_of_mut(&mut v[start..start + n]),
            HostBuf::F16(v) => bytes_of_mut(&mut v[start..start + n]),
        }
    }

    /// `self[at..] += other[from..]` for `n` elements, elementwise, rounding as candle's CPU add.
    pub fn add(&mut self, at: usize, other: &HostBuf, from: usize, n: usize) -> Result<(), CollectiveError> {
        match (self, other) {
            (HostBuf::F32(a), HostBuf::F32(b)) => add_slices(&mut a[at..at + n], &b[from..from + n], |x, y| x + y),
            (HostBuf::F64(a), HostBuf::F64(b)) => add_slices(&mut a[at..at + n], &b[from..from + n], |x, y| x + y),
            (HostBuf::Bf16(a), HostBuf::Bf16(b)) => add_slices(&mut a[at..at + n], &b[from..from + n], |x, y| x + y),
            (HostBuf::F16(a), HostBuf::F16(b)) => add_slices(&mut a[at..at + n], &b[from..from + n], |x, y| x + y),
            (a, b) => {
                return Err(CollectiveError::Mismatch(format!("adding {:?} to {:?}", b.dtype(), a.dtype())));
            }
        }
        Ok(())
    }

    /// `self[at..at+n] = other[from..from+n]`.
    pub fn copy_from(&mut self, at: usize, other: &HostBuf, from: usize, n: usize) -> Result<(), CollectiveError> {
        if self.dtype() != other.dtype() {
            return Err(CollectiveError::Mismatch(format!("copying {:?} into {:?}", other.dtype(), self.dtype())));
        }
        let size = self.elem_size();
        let src = other.bytes(from, n).to_vec();
        self.bytes_mut(at, n)[..n * size].copy_from_slice(&src);
        Ok(())
    }

    /// A tensor of these values on `device`.
    pub fn into_tensor(self, device: &Device) -> Result<Tensor, CollectiveError> {
        let n = self.len();
        let t = match self {
            HostBuf::F32(v) => Tensor::from_vec(v, n, &Device::Cpu)?,
            HostBuf::F64(v) => Tensor::from_vec(v, n, &Device::Cpu)?,
            HostBuf::Bf16(v) => Tensor::from_vec(v, n, &Device::Cpu)?,
            HostBuf::F16(v) => Tensor::from_vec(v, n, &Device::Cpu)?,
        };
        if device.is_cpu() {
            return Ok(t);
        }
        let t = t.to_device(device)?;
        settle(device)?;
        Ok(t)
    }
}

/// [`mindxtrain_kernels::memory::settle`]: the mesh runs on its own thread, so its copies are not
/// ordered after the compute thread's kernels. Without it a gradient was read before its kernels
/// finished (two ranks on a GPU over TCP drifted from one rank: loss 6.08 vs 5.97 after 10 steps,
/// 2026-11-24), and a sum could be handed back before its copy landed.
fn settle(device: &Device) -> Result<(), CollectiveError> {
    mindxtrain_kernels::memory::settle(device)
        .map_err(|e| CollectiveError::Tensor(format!("waiting for the device: {e}")))
}

fn add_slices<T: Copy>(a: &mut [T], b: &[T], add: impl Fn(T, T) -> T) {
    for (x, &y) in a.iter_mut().zip(b) {
        *x = add(*x, y);
    }
}

impl HostBuf {
    /// `bytes` (as [`HostBuf::bytes`] gave them) as a buffer of `dtype`.
    pub fn from_bytes(dtype: DType, bytes: &[u8]) -> Result<HostBuf, CollectiveError> {
        let size = dtype.size_in_bytes();
        if !bytes.len().is_multiple_of(size) {
            return Err(CollectiveError::Mismatch(format!("{} bytes are not {dtype:?} values", bytes.len())));
        }
        let n = bytes.len() / size;
        let mut buf = HostBuf::zeros(dtype, n)?;
        buf.bytes_mut(0, n).copy_from_slice(bytes);
        Ok(buf)
    }
}
