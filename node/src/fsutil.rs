//! Durable file operations shared by the log, the identity and the index.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// fsyncs a directory so that entries created or renamed in it survive a crash.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The directory holding `path`: `.` for a bare file name (whose `parent()` is empty).
pub fn parent_dir(path: &Path) -> &Path {
    path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// Creates `path` (failing if it exists) with `mode`, writes `bytes`, fsyncs the file
/// and its directory. The file appears complete or not at all: it is written under a
/// temporary name first and renamed into place.
pub fn write_new_durably(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    if path.exists() {
        return Err(io::Error::new(io::ErrorKind::AlreadyExists, format!("{} already exists", path.display())));
    }
    replace_durably(path, bytes, mode)
}

/// Writes `bytes` to `path` with `mode`, replacing what was there, so that after a crash
/// the file holds either the old bytes or the new ones: a temporary file, fsync, rename,
/// fsync of the directory.
pub fn replace_durably(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let dir = parent_dir(path);
    let tmp = dir.join(format!(".{}.tmp", path.file_name().and_then(|n| n.to_str()).unwrap_or("file")));
    let _ = std::fs::remove_file(&tmp);
    {
        let mut f = OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    sync_dir(dir)
}
