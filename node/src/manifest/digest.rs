//! SHA-256 and BLAKE3 of a file in one pass over its bytes.
//!
//! The file is memory-mapped and walked in large chunks. For each chunk, SHA-256 runs on
//! one thread while BLAKE3 hashes the same bytes on the rayon pool, so the pass costs
//! about as long as SHA-256 alone (BLAKE3 is several times faster per core) and the file
//! is read once. Digests are of the bytes as they were read: a file rewritten while it
//! is hashed yields digests that the verifier will reject, never a crash.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// Bytes handed to both hashers at a time: large enough that BLAKE3's rayon split has
/// work for every core, small enough that the progress bar moves.
pub const CHUNK: usize = 16 << 20;
/// Bytes per BLAKE3-only step when a progress bar is drawn. Alone, BLAKE3 is ~40x
/// faster than SHA-256, so each fan-out over the rayon pool must be larger for its
/// join and tail costs to vanish; without a bar the whole mapping is one step.
pub const BLAKE3_CHUNK: usize = 512 << 20;
/// Files at least this large get a progress bar (on a terminal only).
pub const PROGRESS_THRESHOLD: u64 = 256 << 20;
/// Below this size a plain buffered read beats setting up a mapping.
const MMAP_THRESHOLD: u64 = 1 << 20;

/// The two digests every subject carries: SHA-256 for interoperability (in-toto consumers
/// know it), BLAKE3 for everything mindxtrain anchors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digests {
    pub sha256: [u8; 32],
    pub blake3: [u8; 32],
}

impl Digests {
    /// Digests of bytes already in memory.
    pub fn of_bytes(bytes: &[u8]) -> Self {
        Self { sha256: Sha256::digest(bytes).into(), blake3: *blake3::hash(bytes).as_bytes() }
    }

    /// The in-toto `DigestSet`: `{"blake3": hex, "sha256": hex}`.
    pub fn to_set(&self) -> DigestSet {
        DigestSet {
            sha256: Some(hex::encode(self.sha256)),
            blake3: Some(hex::encode(self.blake3)),
            other: Default::default(),
        }
    }
}

/// An in-toto DigestSet: algorithm → lowercase hex. Unknown algorithms are kept (and
/// ignored by checks), as the in-toto spec asks of consumers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DigestSet {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blake3: Option<String>,
    #[serde(flatten)]
    pub other: std::collections::BTreeMap<String, String>,
}

impl DigestSet {
    /// Both digests, if the set has both as 64 hex digits.
    pub fn digests(&self) -> Option<Digests> {
        Some(Digests { sha256: parse_hex32(self.sha256.as_deref()?)?, blake3: parse_hex32(self.blake3.as_deref()?)? })
    }
}

/// 64 lowercase or uppercase hex digits → 32 bytes.
pub fn parse_hex32(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 {
        return None;
    }
    hex::decode(text).ok()?.try_into().ok()
}

/// A file's digests and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileDigests {
    pub digests: Digests,
    pub size: u64,
}

/// Which digests to compute (the benchmark times BLAKE3 alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithms {
    Both,
    Blake3Only,
}

/// How to hash: progress bar for big files (drawn on stderr, only when it is a terminal).
#[derive(Debug, Clone, Copy)]
pub struct HashOptions {
    pub progress: bool,
    pub algorithms: Algorithms,
}

impl Default for HashOptions {
    fn default() -> Self {
        Self { progress: true, algorithms: Algorithms::Both }
    }
}

/// SHA-256 and BLAKE3 of the file at `path`, in one pass.
pub fn hash_file(path: &Path, opts: HashOptions) -> io::Result<FileDigests> {
    let file = File::open(path)?;
    let size = file.metadata()?.len();
    let bar = progress_bar(path, size, opts.progress);
    let result =
        if size < MMAP_THRESHOLD { hash_small(file, size, opts) } else { hash_mapped(&file, size, opts, &bar) };
    bar.finish_and_clear();
    result
}

fn hash_small(mut file: File, size: u64, opts: HashOptions) -> io::Result<FileDigests> {
    let mut bytes = Vec::with_capacity(size as usize);
    file.read_to_end(&mut bytes)?;
    let mut d = Digests::of_bytes(&bytes);
    if opts.algorithms == Algorithms::Blake3Only {
        d.sha256 = [0; 32];
    }
    Ok(FileDigests { digests: d, size: bytes.len() as u64 })
}

fn hash_mapped(file: &File, size: u64, opts: HashOptions, bar: &ProgressBar) -> io::Result<FileDigests> {
    // SAFETY: the mapping is read-only and private to this call. If another process
    // truncates the file meanwhile, reads past the new end raise SIGBUS; the node only
    // hashes files it finished writing, and the digests then describe what was read.
    let map = unsafe { memmap2::MmapOptions::new().len(size as usize).map(file)? };
    advise_sequential(&map);
    let mut sha = Sha256::new();
    let mut b3 = blake3::Hasher::new();
    let step = match opts.algorithms {
        Algorithms::Both => CHUNK,
        Algorithms::Blake3Only if bar.is_hidden() => map.len().max(1),
        Algorithms::Blake3Only => BLAKE3_CHUNK,
    };
    for chunk in map.chunks(step) {
        match opts.algorithms {
            Algorithms::Both => std::thread::scope(|s| {
                s.spawn(|| sha.update(chunk));
                b3.update_rayon(chunk);
            }),
            Algorithms::Blake3Only => {
                b3.update_rayon(chunk);
            }
        }
        bar.inc(chunk.len() as u64);
    }
    let sha256 = if opts.algorithms == Algorithms::Both { sha.finalize().into() } else { [0; 32] };
    Ok(FileDigests { digests: Digests { sha256, blake3: *b3.finalize().as_bytes() }, size })
}

fn advise_sequential(map: &memmap2::Mmap) {
    // Read-ahead matters when the file is not in the page cache; failure is harmless.
    let _ = map.advise(memmap2::Advice::Sequential);
}

fn progress_bar(path: &Path, size: u64, wanted: bool) -> ProgressBar {
    if !wanted || size < PROGRESS_THRESHOLD {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(size), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(format!("hashing {}", path.file_name().and_then(|n| n.to_str()).unwrap_or("file")));
    bar
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn write(bytes: &[u8]) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(bytes).unwrap();
        f.flush().unwrap();
        f
    }

    #[test]
    fn one_pass_equals_reference_digests_for_small_and_mapped_files() {
        // Sizes straddle the mmap threshold and the chunk boundary.
        for size in [0usize, 1, 1000, (1 << 20) + 7, CHUNK + 4099] {
            let bytes: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
            let f = write(&bytes);
            let got = hash_file(f.path(), HashOptions { progress: false, algorithms: Algorithms::Both }).unwrap();
            assert_eq!(got.size, size as u64);
            assert_eq!(got.digests.sha256, <[u8; 32]>::from(Sha256::digest(&bytes)), "size {size}");
            assert_eq!(got.digests.blake3, *blake3::hash(&bytes).as_bytes(), "size {size}");
            let b3 = hash_file(f.path(), HashOptions { progress: false, algorithms: Algorithms::Blake3Only }).unwrap();
            assert_eq!(b3.digests.blake3, got.digests.blake3);
        }
    }

    #[test]
    fn known_answer_for_empty_input() {
        let d = Digests::of_bytes(b"");
        assert_eq!(hex::encode(d.sha256), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        assert_eq!(hex::encode(d.blake3), "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262");
    }

    #[test]
    fn digest_sets_parse_only_full_hex() {
        let set = Digests::of_bytes(b"x").to_set();
        assert_eq!(set.digests(), Some(Digests::of_bytes(b"x")));
        let bad = DigestSet { sha256: Some("zz".into()), ..set.clone() };
        assert_eq!(bad.digests(), None);
        let json = serde_json::to_value(&set).unwrap();
        assert_eq!(json.as_object().unwrap().len(), 2);
    }
}
