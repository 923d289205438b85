//! The shingles of the kept examples, read back when an example is a candidate: the newest
//! [`TAIL`] hashes (1 MiB) in memory, the rest in an unlinked temporary file (8 bytes per
//! shingle), so memory holds only each example's 8-byte end offset.

use std::fs::File;
use std::os::unix::fs::FileExt;

use crate::data::error::DataError;

/// Hashes kept in memory before they are written to the file.
pub const TAIL: usize = 1 << 17;

pub struct ShingleStore {
    /// Hashes the tail may hold before it is written out ([`TAIL`]).
    limit: usize,
    /// Where each kept example's shingles end, in hashes from the start.
    ends: Vec<u64>,
    /// The hashes after the spilled ones.
    tail: Vec<u64>,
    /// Created at the first spill: a small dataset never touches the disk.
    spilled: Option<Spilled>,
}

struct Spilled {
    file: File,
    /// Hashes in the file (where `tail` starts).
    hashes: u64,
}

impl ShingleStore {
    pub fn new(limit: usize) -> ShingleStore {
        ShingleStore { limit, ends: Vec::new(), tail: Vec::new(), spilled: None }
    }

    /// Examples stored.
    pub fn len(&self) -> u32 {
        self.ends.len() as u32
    }

    /// How many shingles example `id` has.
    pub fn count(&self, id: u32) -> usize {
        let (start, end) = self.span(id);
        (end - start) as usize
    }

    pub fn push(&mut self, shingles: &[u64]) -> Result<(), DataError> {
        self.tail.extend_from_slice(shingles);
        self.ends.push(self.spilled_hashes() + self.tail.len() as u64);
        if self.tail.len() >= self.limit {
            self.spill()?;
        }
        Ok(())
    }

    /// The shingles of example `id`: from the tail, or read from the file into `scratch`.
    pub fn get<'a>(&'a self, id: u32, scratch: &'a mut Vec<u64>) -> Result<&'a [u64], DataError> {
        let (start, end) = self.span(id);
        match &self.spilled {
            Some(s) if start < s.hashes => {
                let mut bytes = vec![0u8; (end - start) as usize * 8];
                s.file.read_exact_at(&mut bytes, start * 8).map_err(io)?;
                scratch.clear();
                scratch.extend(bytes.chunks_exact(8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default())));
                Ok(scratch)
            }
            _ => {
                let at = (start - self.spilled_hashes()) as usize;
                Ok(&self.tail[at..at + (end - start) as usize])
            }
        }
    }

    fn spilled_hashes(&self) -> u64 {
        self.spilled.as_ref().map_or(0, |s| s.hashes)
    }

    fn span(&self, id: u32) -> (u64, u64) {
        let id = id as usize;
        (if id == 0 { 0 } else { self.ends[id - 1] }, self.ends[id])
    }

    fn spill(&mut self) -> Result<(), DataError> {
        let s = match &mut self.spilled {
            Some(s) => s,
            None => self.spilled.insert(Spilled { file: tempfile::tempfile().map_err(io)?, hashes: 0 }),
        };
        let bytes: Vec<u8> = self.tail.iter().flat_map(|h| h.to_le_bytes()).collect();
        s.file.write_all_at(&bytes, s.hashes * 8).map_err(io)?;
        s.hashes += self.tail.len() as u64;
        self.tail.clear();
        Ok(())
    }
}

fn io(source: std::io::Error) -> DataError {
    DataError::Io { path: std::env::temp_dir().join("(near-dedupe shingles, unlinked)"), source }
}
