//! Strict JSONL reading: one record per line, every bad line an error naming file and line,
//! or (with `skip_bad`) counted and reported. Each file's BLAKE3 is taken from the same bytes
//! that are parsed, so the manifest describes exactly what was trained on.

use std::io::{BufRead, BufReader};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::error::DataError;
use super::example::Example;
use super::json::Json;
use super::record::example_from_json;
use crate::recipe::DataFormat;

/// How many skipped lines are described one by one; the count covers them all.
pub const MAX_REPORTED_SKIPS: usize = 100;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileDigest {
    /// The path as the recipe wrote it (or a `generated:` name).
    pub path: String,
    pub blake3: String,
    pub bytes: u64,
    pub lines: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedLine {
    pub path: String,
    pub line: u64,
    pub reason: String,
}

/// Everything read from a set of files.
#[derive(Debug, Clone, Default)]
pub struct ReadOutcome {
    pub examples: Vec<Example>,
    pub files: Vec<FileDigest>,
    pub skipped: u64,
    /// The first [`MAX_REPORTED_SKIPS`] skipped lines.
    pub skipped_lines: Vec<SkippedLine>,
}

impl ReadOutcome {
    /// Reads one JSONL file and appends its records. `name` is how the file is reported.
    pub fn read_file(&mut self, path: &Path, name: &str, format: DataFormat, skip_bad: bool) -> Result<(), DataError> {
        let io_err = |source| DataError::Io { path: path.to_owned(), source };
        let file = std::fs::File::open(path).map_err(io_err)?;
        let mut reader = BufReader::with_capacity(1 << 20, file);
        let mut hasher = blake3::Hasher::new();
        let (mut bytes, mut line_no) = (0u64, 0u64);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            let n = reader.read_until(b'\n', &mut buf).map_err(io_err)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf);
            bytes += n as u64;
            line_no += 1;
            let mut line = buf.as_slice();
            if line_no == 1 {
                line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
            }
            match parse_line(line, format) {
                Ok(Some(example)) => self.examples.push(example),
                Ok(None) => {}
                Err(reason) if skip_bad => {
                    self.skipped += 1;
                    if self.skipped_lines.len() < MAX_REPORTED_SKIPS {
                        self.skipped_lines.push(SkippedLine { path: name.to_owned(), line: line_no, reason });
                    }
                }
                Err(reason) => return Err(DataError::BadLine { path: name.into(), line: line_no, reason }),
            }
        }
        self.files.push(FileDigest {
            path: name.to_owned(),
            blake3: hasher.finalize().to_hex().to_string(),
            bytes,
            lines: line_no,
        });
        Ok(())
    }
}

/// One line (with or without its newline) to an example; `None` for a blank line.
pub fn parse_line(line: &[u8], format: DataFormat) -> Result<Option<Example>, String> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let text = std::str::from_utf8(line).map_err(|e| {
        format!("not UTF-8 text (invalid byte 0x{:02x} at column {})", line[e.valid_up_to()], e.valid_up_to() + 1)
    })?;
    if text.trim().is_empty() {
        return Ok(None);
    }
    let value: Json = serde_json::from_str(text).map_err(|e| {
        // serde_json says "at line 1 column N"; the line is ours to report.
        let message = e.to_string();
        let message = message.split(" at line ").next().unwrap_or(&message).to_owned();
        format!("invalid JSON at column {}: {message}", e.column())
    })?;
    example_from_json(&value, format).map(Some)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::data::example::{Message, Role};

    const CHAT_OK: &str = r#"{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]}"#;

    fn write(dir: &Path, name: &str, text: &[u8]) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn bad_line_error_names_file_line_and_problem() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!("{CHAT_OK}\n\n{CHAT_OK}\n{{\"messages\": [}}\n");
        let p = write(dir.path(), "d.jsonl", text.as_bytes());
        let err = ReadOutcome::default().read_file(&p, "data/d.jsonl", DataFormat::Chat, false).unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("data/d.jsonl:4: invalid JSON at column"), "{msg}");
        assert!(matches!(err, DataError::BadLine { line: 4, .. }));
    }

    #[test]
    fn skip_bad_counts_and_reports_every_bad_line() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!("{CHAT_OK}\nnot json\n{{\"text\":\"x\"}}\n\u{FEFF}\n{CHAT_OK}\r\n");
        let p = write(dir.path(), "d.jsonl", text.as_bytes());
        let mut out = ReadOutcome::default();
        out.read_file(&p, "d.jsonl", DataFormat::Chat, true).unwrap();
        assert_eq!(out.examples.len(), 2);
        assert_eq!(out.skipped, 3);
        let lines: Vec<u64> = out.skipped_lines.iter().map(|s| s.line).collect();
        assert_eq!(lines, vec![2, 3, 4]);
        assert!(out.skipped_lines[1].reason.contains("missing field `messages`"));
        assert_eq!(out.files[0].lines, 5);
        assert_eq!(out.files[0].blake3, blake3::hash(text.as_bytes()).to_hex().to_string());
    }

    #[test]
    fn bom_crlf_and_blank_lines_are_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!("\u{FEFF}{CHAT_OK}\r\n   \n{CHAT_OK}");
        let p = write(dir.path(), "d.jsonl", text.as_bytes());
        let mut out = ReadOutcome::default();
        out.read_file(&p, "d.jsonl", DataFormat::Chat, false).unwrap();
        assert_eq!(out.examples.len(), 2);
        let Example::Chat(c) = &out.examples[1] else { panic!() };
        assert_eq!(c.messages[1], Message::new(Role::Assistant, "b"));
    }

    #[test]
    fn non_utf8_is_a_bad_line() {
        let err = parse_line(b"{\"text\": \"\xff\"}", DataFormat::Text).unwrap_err();
        assert!(err.contains("not UTF-8"), "{err}");
    }

    #[test]
    fn missing_file_is_an_io_error_with_the_path() {
        let err = ReadOutcome::default()
            .read_file(Path::new("/nonexistent/x.jsonl"), "x", DataFormat::Text, true)
            .unwrap_err();
        assert!(matches!(err, DataError::Io { .. }));
        assert!(err.to_string().contains("/nonexistent/x.jsonl"));
    }

    proptest! {
        #[test]
        fn parser_never_panics_on_arbitrary_bytes(line in proptest::collection::vec(any::<u8>(), 0..200)) {
            for format in [DataFormat::Chat, DataFormat::Instruction, DataFormat::Text, DataFormat::Preference] {
                let _ = parse_line(&line, format);
            }
        }

        #[test]
        fn parser_never_panics_on_json_like_lines(line in r#"[\[\]{}":,a-z0-9 \\]{0,80}"#) {
            for format in [DataFormat::Chat, DataFormat::Instruction, DataFormat::Text, DataFormat::Preference] {
                let _ = parse_line(line.as_bytes(), format);
            }
        }

        #[test]
        fn every_bad_line_is_reported_with_its_number(bad_at in proptest::collection::btree_set(1u64..30, 0..10)) {
            let dir = tempfile::tempdir().unwrap();
            let text: String = (1..30u64)
                .map(|i| if bad_at.contains(&i) { "{\"text\": 5}\n".to_owned() } else { format!("{{\"text\":\"{i}\"}}\n") })
                .collect();
            let p = write(dir.path(), "p.jsonl", text.as_bytes());
            let mut out = ReadOutcome::default();
            out.read_file(&p, "p.jsonl", DataFormat::Text, true).unwrap();
            let lines: Vec<u64> = out.skipped_lines.iter().map(|s| s.line).collect();
            prop_assert_eq!(lines, bad_at.iter().copied().collect::<Vec<_>>());
            prop_assert_eq!(out.examples.len() as u64, 29 - bad_at.len() as u64);
            if let Some(&first) = bad_at.iter().next() {
                let err = ReadOutcome::default().read_file(&p, "p.jsonl", DataFormat::Text, false).unwrap_err();
                let is_first_bad_line = matches!(err, DataError::BadLine { line, .. } if line == first);
                prop_assert!(is_first_bad_line);
            }
        }
    }
}
