//! TensorBoard scalar event files, for users who watch curves (`train --tensorboard`).
//!
//! The format is TensorFlow's TFRecord of `Event` protocol buffers, written by hand (a few
//! fields; no protobuf crate): each record is `length u64 LE | masked crc32c(length) u32 |
//! data | masked crc32c(data) u32`, the first event carries `file_version: "brain.Event:2"`,
//! and each later one a `step`, a `wall_time` and one `Summary.Value{tag, simple_value}`.
//! Every record is flushed as it is written, so `tensorboard --logdir` follows a run live.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// A TensorBoard event file being written.
pub struct EventWriter {
    file: BufWriter<File>,
    path: PathBuf,
}

/// TFRecord's masked CRC-32C (so that a CRC of data holding CRCs stays well distributed).
pub fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn bytes_field(out: &mut Vec<u8>, field: u8, bytes: &[u8]) {
    out.push((field << 3) | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn wall_time() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// An `Event` with `wall_time`, `step` and either a file version or one scalar.
fn event(step: u64, body: &Body<'_>) -> Vec<u8> {
    let mut e = Vec::with_capacity(64);
    e.push((1 << 3) | 1); // wall_time: double
    e.extend_from_slice(&wall_time().to_le_bytes());
    e.push(2 << 3); // step: int64
    varint(&mut e, step);
    match body {
        Body::Version => bytes_field(&mut e, 3, b"brain.Event:2"),
        Body::Scalar(tag, value) => {
            let mut v = Vec::with_capacity(tag.len() + 8);
            bytes_field(&mut v, 1, tag.as_bytes());
            v.push((2 << 3) | 5); // simple_value: float
            v.extend_from_slice(&value.to_le_bytes());
            let mut summary = Vec::with_capacity(v.len() + 2);
            bytes_field(&mut summary, 1, &v);
            bytes_field(&mut e, 5, &summary);
        }
    }
    e
}

enum Body<'a> {
    Version,
    Scalar(&'a str, f32),
}

impl EventWriter {
    /// Starts a new event file in `dir` (created when missing).
    pub fn create(dir: &Path) -> std::io::Result<EventWriter> {
        std::fs::create_dir_all(dir)?;
        let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let path = dir.join(format!("events.out.tfevents.{secs}.mindxtrain.{}", std::process::id()));
        let file = std::fs::OpenOptions::new().write(true).create_new(true).open(&path)?;
        let mut w = EventWriter { file: BufWriter::new(file), path };
        w.record(&event(0, &Body::Version))?;
        Ok(w)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes one scalar at `step` and flushes it.
    pub fn scalar(&mut self, tag: &str, step: u64, value: f64) -> std::io::Result<()> {
        self.record(&event(step, &Body::Scalar(tag, value as f32)))
    }

    fn record(&mut self, data: &[u8]) -> std::io::Result<()> {
        let len = (data.len() as u64).to_le_bytes();
        self.file.write_all(&len)?;
        self.file.write_all(&masked_crc(&len).to_le_bytes())?;
        self.file.write_all(data)?;
        self.file.write_all(&masked_crc(data).to_le_bytes())?;
        self.file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// TensorFlow's mask (`((crc >> 15) | (crc << 17)) + 0xa282ead8`) of CRC-32C(b"foo"),
    /// computed with a bitwise CRC outside this crate.
    #[test]
    fn the_mask_matches_tensorflow() {
        assert_eq!(crc32c::crc32c(b"foo"), 0xcfc4_ae1d);
        assert_eq!(masked_crc(b"foo"), 0xfebe_8a61);
    }

    #[test]
    fn records_frame_and_checksum_each_event() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = EventWriter::create(dir.path()).unwrap();
        w.scalar("train/loss", 7, 1.5).unwrap();
        let bytes = std::fs::read(w.path()).unwrap();
        let mut at = 0;
        let mut records = Vec::new();
        while at < bytes.len() {
            let len = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
            assert_eq!(u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()), masked_crc(&bytes[at..at + 8]));
            let data = &bytes[at + 12..at + 12 + len];
            let crc = u32::from_le_bytes(bytes[at + 12 + len..at + 16 + len].try_into().unwrap());
            assert_eq!(crc, masked_crc(data));
            records.push(data.to_vec());
            at += 16 + len;
        }
        assert_eq!(records.len(), 2);
        assert!(records[0].windows(13).any(|w| w == b"brain.Event:2"));
        let scalar = &records[1];
        // step 7, the tag, and 1.5f32 after the simple_value tag byte.
        assert_eq!(&scalar[9..11], &[0x10, 7]);
        assert!(scalar.windows(10).any(|w| w == b"train/loss"));
        let value = 1.5f32.to_le_bytes();
        assert!(scalar.windows(5).any(|w| w[0] == 0x15 && w[1..] == value));
    }
}
