//! Crash-safe checkpoint directories.
//!
//! Files go into a hidden staging directory next to the target; each is fsynced as it is
//! closed. [`StagedDir::commit`] fsyncs the staging directory, renames it to the target and
//! fsyncs the parent, so the target name appears only with complete, durable contents. The
//! `latest` pointer is a small file replaced by write-temp, fsync, rename, fsync-dir. A kill -9
//! anywhere leaves the old pointer with the old checkpoint, or the new pointer with the new one.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::CheckpointError;
use super::error::io;

/// One file of a saved checkpoint, as listed in the `checkpoint.saved` event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileDigest {
    /// Relative to the checkpoint directory, `/`-separated.
    pub path: String,
    pub bytes: u64,
    /// Lowercase hex BLAKE3 of the contents.
    pub blake3: String,
}

/// A checkpoint directory under construction; see the module doc.
#[derive(Debug)]
pub struct StagedDir {
    staging: PathBuf,
    target: PathBuf,
    files: Vec<FileDigest>,
}

const PARTIAL_SUFFIX: &str = ".partial";
const DELETING_SUFFIX: &str = ".deleting";
const LATEST: &str = "latest";

fn hidden_sibling(target: &Path, suffix: &str) -> Result<PathBuf, CheckpointError> {
    let name = target.file_name().and_then(|n| n.to_str()).ok_or_else(|| CheckpointError::Io {
        path: target.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "checkpoint path needs a UTF-8 file name"),
    })?;
    Ok(target.with_file_name(format!(".{name}{suffix}")))
}

fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

struct DigestWriter<W: Write> {
    inner: W,
    hasher: blake3::Hasher,
    bytes: u64,
}

impl<W: Write> Write for DigestWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

impl StagedDir {
    /// Starts a checkpoint that will live at `target`, which must not exist yet. A staging
    /// directory left by an earlier crash is discarded.
    pub fn create(target: &Path) -> Result<Self, CheckpointError> {
        if target.exists() {
            return Err(CheckpointError::Exists { path: target.to_path_buf() });
        }
        let staging = hidden_sibling(target, PARTIAL_SUFFIX)?;
        if staging.exists() {
            fs::remove_dir_all(&staging).map_err(io(&staging))?;
        }
        fs::create_dir_all(&staging).map_err(io(&staging))?;
        Ok(StagedDir { staging, target: target.to_path_buf(), files: Vec::new() })
    }

    /// Where files are being written (not the final path).
    pub fn staging_path(&self) -> &Path {
        &self.staging
    }

    pub fn target_path(&self) -> &Path {
        &self.target
    }

    /// Writes `rel` (a `/`-separated relative path) from `bytes`.
    pub fn write_file(&mut self, rel: &str, bytes: &[u8]) -> Result<(), CheckpointError> {
        self.write_with(rel, |w| w.write_all(bytes).map_err(io(rel)))
    }

    /// Writes `rel` through `fill`, which streams into the writer it is given.
    pub fn write_with(
        &mut self,
        rel: &str,
        fill: impl FnOnce(&mut dyn Write) -> Result<(), CheckpointError>,
    ) -> Result<(), CheckpointError> {
        let bad = rel.is_empty()
            || rel.starts_with('/')
            || rel.split('/').any(|c| c.is_empty() || c == "." || c == "..")
            || self.files.iter().any(|f| f.path == rel);
        if bad {
            return Err(CheckpointError::Io {
                path: self.staging.join(rel),
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "bad or repeated relative path"),
            });
        }
        let path = self.staging.join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(io(parent))?;
        }
        let file = File::create(&path).map_err(io(&path))?;
        let mut w =
            DigestWriter { inner: BufWriter::with_capacity(1 << 20, file), hasher: blake3::Hasher::new(), bytes: 0 };
        fill(&mut w)?;
        let DigestWriter { inner, hasher, bytes } = w;
        let file =
            inner.into_inner().map_err(|e| CheckpointError::Io { path: path.clone(), source: e.into_error() })?;
        file.sync_all().map_err(io(&path))?;
        self.files.push(FileDigest { path: rel.to_string(), bytes, blake3: hasher.finalize().to_hex().to_string() });
        Ok(())
    }

    /// Makes the checkpoint visible at its target path, durably; returns its files sorted by path.
    pub fn commit(mut self) -> Result<Vec<FileDigest>, CheckpointError> {
        let mut dirs: Vec<PathBuf> =
            self.files.iter().filter_map(|f| self.staging.join(&f.path).parent().map(Path::to_path_buf)).collect();
        dirs.sort();
        dirs.dedup();
        for d in dirs.iter().rev() {
            sync_dir(d)?;
        }
        sync_dir(&self.staging)?;
        if self.target.exists() {
            return Err(CheckpointError::Exists { path: self.target.clone() });
        }
        fs::rename(&self.staging, &self.target).map_err(io(&self.target))?;
        if let Some(parent) = self.target.parent() {
            sync_dir(if parent.as_os_str().is_empty() { Path::new(".") } else { parent })?;
        }
        self.files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(std::mem::take(&mut self.files))
    }
}

/// Points `root/latest` at the checkpoint directory `root/name`, atomically and durably.
pub fn publish_latest(root: &Path, name: &str) -> Result<(), CheckpointError> {
    if !plain_name(name) || !root.join(name).is_dir() {
        return Err(CheckpointError::Io {
            path: root.join(name),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "not a checkpoint directory in root"),
        });
    }
    let tmp = root.join(".latest.tmp");
    let mut f = File::create(&tmp).map_err(io(&tmp))?;
    f.write_all(format!("{name}\n").as_bytes()).and_then(|()| f.sync_all()).map_err(io(&tmp))?;
    let dst = root.join(LATEST);
    fs::rename(&tmp, &dst).map_err(io(&dst))?;
    sync_dir(root)
}

/// The checkpoint directory `root/latest` names, if any.
pub fn latest(root: &Path) -> Result<Option<PathBuf>, CheckpointError> {
    let path = root.join(LATEST);
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(CheckpointError::Io { path, source: e }),
    };
    let name = text.trim_end_matches('\n');
    if !plain_name(name) || !root.join(name).is_dir() {
        return Err(CheckpointError::BadState {
            path,
            reason: format!("points at `{name}`, not a checkpoint directory"),
        });
    }
    Ok(Some(root.join(name)))
}

fn plain_name(name: &str) -> bool {
    !name.is_empty() && !name.starts_with('.') && !name.contains('/') && !name.contains('\0')
}

/// Keeps the `keep_last` checkpoints that sort last by name (name them so that this is their
/// age, e.g. zero-padded step numbers) plus the one `latest` points at, and removes the other
/// directories that start with `prefix`, along with leftovers of interrupted saves and prunes.
/// A directory is renamed to a hidden name before it is deleted, so a crash mid-delete never
/// leaves a half-deleted checkpoint under a checkpoint name. Returns the names removed.
pub fn prune(root: &Path, prefix: &str, keep_last: usize) -> Result<Vec<String>, CheckpointError> {
    let current = latest(root)?.and_then(|p| p.file_name().and_then(|n| n.to_str()).map(String::from));
    let mut names = Vec::new();
    let mut leftovers = Vec::new();
    for entry in fs::read_dir(root).map_err(io(root))? {
        let entry = entry.map_err(io(root))?;
        let Some(name) = entry.file_name().to_str().map(String::from) else { continue };
        if !entry.file_type().map_err(io(entry.path()))?.is_dir() {
            continue;
        }
        if name.starts_with('.') && (name.ends_with(PARTIAL_SUFFIX) || name.ends_with(DELETING_SUFFIX)) {
            leftovers.push(entry.path());
        } else if name.starts_with(prefix) {
            names.push(name);
        }
    }
    names.sort();
    let cut = names.len().saturating_sub(keep_last);
    let mut removed = Vec::new();
    for name in &names[..cut] {
        if Some(name) == current.as_ref() {
            continue;
        }
        let doomed = hidden_sibling(&root.join(name), DELETING_SUFFIX)?;
        fs::rename(root.join(name), &doomed).map_err(io(&doomed))?;
        leftovers.push(doomed);
        removed.push(name.clone());
    }
    sync_dir(root)?;
    for dir in leftovers {
        fs::remove_dir_all(&dir).map_err(io(&dir))?;
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_reveals_complete_dir_with_digests() {
        let root = tempfile::tempdir().unwrap();
        let target = root.path().join("step-00000001");
        let mut dir = StagedDir::create(&target).unwrap();
        dir.write_file("b.json", b"{}").unwrap();
        dir.write_file("sub/a.bin", b"hello").unwrap();
        assert!(!target.exists(), "visible before commit");
        let files = dir.commit().unwrap();
        assert_eq!(files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(), ["b.json", "sub/a.bin"]);
        assert_eq!(files[1].bytes, 5);
        assert_eq!(files[1].blake3, blake3::hash(b"hello").to_hex().to_string());
        assert_eq!(fs::read(target.join("sub/a.bin")).unwrap(), b"hello");
        assert!(matches!(StagedDir::create(&target), Err(CheckpointError::Exists { .. })));
    }

    #[test]
    fn bad_relative_paths_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let mut dir = StagedDir::create(&root.path().join("c")).unwrap();
        for bad in ["", "/abs", "../x", "a//b", "./a"] {
            assert!(dir.write_file(bad, b"").is_err(), "{bad}");
        }
        dir.write_file("x", b"").unwrap();
        assert!(dir.write_file("x", b"").is_err(), "repeated path");
    }

    #[test]
    fn abandoned_staging_is_invisible_and_replaced() {
        let root = tempfile::tempdir().unwrap();
        let target = root.path().join("step-2");
        let mut dir = StagedDir::create(&target).unwrap();
        dir.write_file("half", b"x").unwrap();
        drop(dir); // as if killed before commit
        assert!(!target.exists());
        let mut again = StagedDir::create(&target).unwrap();
        again.write_file("whole", b"y").unwrap();
        again.commit().unwrap();
        assert!(!target.join("half").exists() && target.join("whole").exists());
    }

    #[test]
    fn latest_pointer_and_prune() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        assert_eq!(latest(r).unwrap(), None);
        for step in 1..=4 {
            let mut d = StagedDir::create(&r.join(format!("step-{step:08}"))).unwrap();
            d.write_file("f", &[step as u8]).unwrap();
            d.commit().unwrap();
        }
        publish_latest(r, "step-00000002").unwrap();
        assert_eq!(latest(r).unwrap(), Some(r.join("step-00000002")));
        assert!(publish_latest(r, "../etc").is_err());
        assert!(publish_latest(r, "step-00000009").is_err());
        // An interrupted save leaves a staging dir: prune clears it.
        let _left = StagedDir::create(&r.join("step-00000005")).unwrap();
        let removed = prune(r, "step-", 2).unwrap();
        assert_eq!(removed, ["step-00000001"]); // 2 is kept because latest points at it
        let mut left: Vec<_> =
            fs::read_dir(r).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        left.sort();
        assert_eq!(left, ["latest", "step-00000002", "step-00000003", "step-00000004"]);
        fs::write(r.join("latest"), "nowhere\n").unwrap();
        assert!(latest(r).is_err());
    }
}
