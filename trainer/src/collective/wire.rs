//! Framing on the TCP connections: data frames between ranks, JSON frames on the control
//! connection to the launcher.

use serde::Serialize;
use serde::de::DeserializeOwned;
use std::io::{self, Read, Write};

/// The largest control message accepted (a `run.finished` event with its file list is far
/// smaller); a longer length is a corrupt or foreign stream.
const MAX_CONTROL: usize = 64 << 20;

/// Sent first on every mesh connection: who is calling, for which run.
pub(crate) const MESH_MAGIC: [u8; 8] = *b"mxtmesh1";

/// Header of one collective's data between two ranks: the operation and its sequence number (so
/// ranks doing different things are caught at once) and the payload length in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DataHeader {
    pub op: u8,
    pub seq: u64,
    pub len: u64,
}

impl DataHeader {
    pub const SIZE: usize = 17;

    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut out = [0u8; Self::SIZE];
        out[0] = self.op;
        out[1..9].copy_from_slice(&self.seq.to_le_bytes());
        out[9..17].copy_from_slice(&self.len.to_le_bytes());
        out
    }

    pub fn decode(b: &[u8; Self::SIZE]) -> DataHeader {
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        DataHeader { op: b[0], seq: u64_at(1), len: u64_at(9) }
    }
}

/// Writes one JSON message: a u32 little-endian length, then the bytes.
pub(crate) fn write_json(w: &mut impl Write, msg: &impl Serialize) -> io::Result<()> {
    let bytes = serde_json::to_vec(msg).map_err(io::Error::other)?;
    let len = u32::try_from(bytes.len()).map_err(|_| io::Error::other("control message over 4 GiB"))?;
    let mut frame = Vec::with_capacity(4 + bytes.len());
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(&bytes);
    w.write_all(&frame)?;
    w.flush()
}

/// Reads one JSON message; `Ok(None)` at a clean end of stream.
pub(crate) fn read_json<T: DeserializeOwned>(r: &mut impl Read) -> io::Result<Option<T>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_CONTROL {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("control message of {len} bytes")));
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf)?;
    serde_json::from_slice(&buf).map(Some).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_header_round_trips() {
        let h = DataHeader { op: 3, seq: 1 << 40, len: 12345 };
        assert_eq!(DataHeader::decode(&h.encode()), h);
    }

    #[test]
    fn json_frames_round_trip_and_end_cleanly() {
        let mut buf = Vec::new();
        write_json(&mut buf, &serde_json::json!({"a": 1})).unwrap();
        write_json(&mut buf, &"two").unwrap();
        let mut r = buf.as_slice();
        assert_eq!(read_json::<serde_json::Value>(&mut r).unwrap(), Some(serde_json::json!({"a": 1})));
        assert_eq!(read_json::<String>(&mut r).unwrap(), Some("two".into()));
        assert_eq!(read_json::<String>(&mut r).unwrap(), None);
        let huge = (u32::MAX).to_le_bytes();
        assert!(read_json::<String>(&mut huge.as_slice()).is_err());
    }
}
