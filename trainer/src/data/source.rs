//! Where records come from, one block at a time: JSONL files (blocks of [`BLOCK_ROWS`]
//! lines, found again by byte offset), Parquet and Arrow files (blocks of a row group or
//! record batch), and the task generator's JSONL (held in memory).
//!
//! [`Source::index`] reads every block once, in order, hashing every file; [`Source::read`]
//! reads one block again. A file whose size or modification time changed in between is an
//! error ([`DataError::Changed`]): what was trained on must be what the manifest describes.

mod arrow_json;
pub mod files;
pub mod rows;
mod table;

use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

pub use files::{FileKind, InputFile};
pub use table::BLOCK_ROWS;
use table::{ColumnKind, FieldSpec, Table};

use super::error::{DataError, TableError};
use super::example::Example;
use super::jsonl::{FileDigest, parse_line};
use super::record::example_from_json;
use crate::recipe::DataFormat;

/// A run of rows of one input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub input: u32,
    /// The row group or record batch (0 for line files).
    pub group: u32,
    /// The first row within the group (line files: the 0-based line number).
    pub first: u64,
    pub rows: u32,
    /// Line files: the byte offset of the first line.
    pub offset: u64,
}

/// One row of a block: an example, nothing (a blank line), or why it is not one.
pub type Row = Result<Option<Example>, DataError>;

/// Names a row of the block being visited in an error: `locate(row, reason)`.
pub type Locate<'a> = &'a dyn Fn(usize, String) -> DataError;

/// What [`Source::index`] calls with each block: its index, its rows, and how to name a row.
pub type Visit<'a> = &'a mut dyn FnMut(usize, Vec<Row>, Locate<'_>) -> Result<(), DataError>;

enum Reader {
    Lines,
    Memory(Arc<str>),
    Table(Box<Table>),
}

struct Input {
    file: InputFile,
    reader: Reader,
    /// Size and modification time when indexed.
    stamp: Option<(u64, Option<SystemTime>)>,
}

/// The inputs of a dataset and the blocks they were read in.
pub struct Source {
    inputs: Vec<Input>,
    pub blocks: Vec<Block>,
    format: DataFormat,
}

impl Source {
    /// The files of the recipe (already resolved), read as `format` with `columns` mapping
    /// record fields to table columns.
    pub fn files(files: Vec<InputFile>, format: DataFormat, columns: &[(String, String)]) -> Result<Source, DataError> {
        let specs = field_specs(format);
        let inputs = files
            .into_iter()
            .map(|file| {
                let reader = match file.kind {
                    FileKind::Jsonl => Reader::Lines,
                    _ => Reader::Table(Box::new(Table::open(&file, specs, columns)?)),
                };
                Ok(Input { file, reader, stamp: None })
            })
            .collect::<Result<_, DataError>>()?;
        Ok(Source { inputs, blocks: Vec::new(), format })
    }

    /// JSONL text held in memory (the generator's), reported as `name`.
    pub fn memory(name: &str, text: Arc<str>, format: DataFormat) -> Source {
        let file = InputFile { path: PathBuf::from(name), name: name.to_owned(), kind: FileKind::Jsonl };
        Source { inputs: vec![Input { file, reader: Reader::Memory(text), stamp: None }], blocks: Vec::new(), format }
    }

    /// Reads every block once, in order, calling `visit(block index, rows)`; records the
    /// blocks and returns every input's digest.
    pub fn index(&mut self, visit: Visit<'_>) -> Result<Vec<FileDigest>, DataError> {
        let mut digests = Vec::with_capacity(self.inputs.len());
        for i in 0..self.inputs.len() {
            let digest = match &self.inputs[i].reader {
                Reader::Lines | Reader::Memory(_) => self.index_lines(i, visit)?,
                Reader::Table(_) => self.index_table(i, visit)?,
            };
            digests.push(digest);
        }
        Ok(digests)
    }

    /// The rows of block `b`, read again.
    pub fn read(&self, b: usize) -> Result<Vec<Row>, DataError> {
        let block = self.blocks[b];
        let input = &self.inputs[block.input as usize];
        check_stamp(input)?;
        match &input.reader {
            Reader::Memory(text) => Ok(self.lines(input, &block, &mut std::io::Cursor::new(text.as_bytes()))?),
            Reader::Lines => {
                let path = &input.file.path;
                let mut file =
                    std::fs::File::open(path).map_err(|source| DataError::Io { path: path.clone(), source })?;
                file.seek(SeekFrom::Start(block.offset))
                    .map_err(|source| DataError::Io { path: path.clone(), source })?;
                self.lines(input, &block, &mut BufReader::new(file))
            }
            Reader::Table(table) => {
                let batch = table.read(block.group as usize, block.first, block.rows as usize)?;
                Ok(self.table_rows(table, input, &block, &batch))
            }
        }
    }

    fn index_lines(&mut self, i: usize, visit: Visit<'_>) -> Result<FileDigest, DataError> {
        let input = &self.inputs[i];
        let path = input.file.path.clone();
        let io = |source| DataError::Io { path: path.clone(), source };
        let mut reader: Box<dyn BufRead> = match &input.reader {
            Reader::Memory(text) => Box::new(std::io::Cursor::new(text.as_bytes().to_vec())),
            _ => Box::new(BufReader::with_capacity(1 << 20, std::fs::File::open(&path).map_err(io)?)),
        };
        let stamp = stamp_of(input)?;
        let mut hasher = blake3::Hasher::new();
        let (mut bytes, mut line_no) = (0u64, 0u64);
        let mut buf = Vec::new();
        let mut rows = Vec::with_capacity(BLOCK_ROWS);
        let mut block = Block { input: i as u32, group: 0, first: 0, rows: 0, offset: 0 };
        loop {
            buf.clear();
            let n = reader.read_until(b'\n', &mut buf).map_err(io)?;
            if n > 0 {
                hasher.update(&buf);
                rows.push(self.line_row(&self.inputs[i], line_no, &buf));
                bytes += n as u64;
                line_no += 1;
            }
            if rows.len() == BLOCK_ROWS || (n == 0 && !rows.is_empty()) {
                block.rows = rows.len() as u32;
                self.blocks.push(block);
                let name = self.inputs[i].file.name.clone();
                let first = block.first;
                let locate = |r: usize, reason: String| DataError::BadLine {
                    path: name.clone().into(),
                    line: first + r as u64 + 1,
                    reason,
                };
                visit(self.blocks.len() - 1, std::mem::take(&mut rows), &locate)?;
                block = Block { input: i as u32, group: 0, first: line_no, rows: 0, offset: bytes };
            }
            if n == 0 {
                break;
            }
        }
        self.inputs[i].stamp = stamp;
        let name = self.inputs[i].file.name.clone();
        Ok(FileDigest { path: name, blake3: hasher.finalize().to_hex().to_string(), bytes, lines: line_no })
    }

    fn index_table(&mut self, i: usize, visit: Visit<'_>) -> Result<FileDigest, DataError> {
        let input = &self.inputs[i];
        let path = input.file.path.clone();
        let stamp = stamp_of(input)?;
        let mut hasher = blake3::Hasher::new();
        hasher.update_mmap_rayon(&path).map_err(|source| DataError::Io { path: path.clone(), source })?;
        let Reader::Table(table) = &input.reader else { unreachable!("index_table is called for tables") };
        let mut blocks = Vec::new();
        let mut total = 0u64;
        let first_index = self.blocks.len();
        for group in 0..table.groups() {
            table.read_group(group, &mut |first, batch| {
                let block =
                    Block { input: i as u32, group: group as u32, first, rows: batch.num_rows() as u32, offset: 0 };
                let rows = self.table_rows(table, input, &block, &batch);
                blocks.push(block);
                total += u64::from(block.rows);
                let locate = |r: usize, message: String| {
                    DataError::BadTable(Box::new(TableError {
                        path: input.file.name.clone().into(),
                        group: Some(table.group_label(group)),
                        column: None,
                        row: Some(first + r as u64),
                        message,
                    }))
                };
                visit(first_index + blocks.len() - 1, rows, &locate)
            })?;
        }
        self.blocks.extend(blocks);
        let bytes = stamp.map_or(0, |s| s.0);
        self.inputs[i].stamp = stamp;
        let name = self.inputs[i].file.name.clone();
        Ok(FileDigest { path: name, blake3: hasher.finalize().to_hex().to_string(), bytes, lines: total })
    }

    fn lines(&self, input: &Input, block: &Block, reader: &mut dyn BufRead) -> Result<Vec<Row>, DataError> {
        let mut rows = Vec::with_capacity(block.rows as usize);
        let mut buf = Vec::new();
        for k in 0..u64::from(block.rows) {
            buf.clear();
            let n = reader
                .read_until(b'\n', &mut buf)
                .map_err(|source| DataError::Io { path: input.file.path.clone(), source })?;
            if n == 0 {
                return Err(DataError::Changed { path: input.file.path.clone(), reason: "lines are missing".into() });
            }
            rows.push(self.line_row(input, block.first + k, &buf));
        }
        Ok(rows)
    }

    fn line_row(&self, input: &Input, line_no: u64, buf: &[u8]) -> Row {
        let line = if line_no == 0 { buf.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(buf) } else { buf };
        parse_line(line, self.format).map_err(|reason| DataError::BadLine {
            path: input.file.name.clone().into(),
            line: line_no + 1,
            reason,
        })
    }

    fn table_rows(&self, table: &Table, input: &Input, block: &Block, batch: &arrow_array::RecordBatch) -> Vec<Row> {
        (0..batch.num_rows())
            .map(|r| {
                let record = table.record(batch, r);
                example_from_json(&record, self.format).map(Some).map_err(|reason| {
                    // The record check names the field first (`messages[2].role: ...`).
                    let field = reason.split(['[', '.', ':', ' ']).next().unwrap_or_default().trim_matches('`');
                    DataError::BadTable(Box::new(TableError {
                        path: input.file.name.clone().into(),
                        group: Some(table.group_label(block.group as usize)),
                        column: table.column_of(field).map(str::to_owned),
                        row: Some(block.first + r as u64),
                        message: reason,
                    }))
                })
            })
            .collect()
    }
}

fn stamp_of(input: &Input) -> Result<Option<(u64, Option<SystemTime>)>, DataError> {
    if matches!(input.reader, Reader::Memory(_)) {
        return Ok(None);
    }
    let meta = std::fs::metadata(&input.file.path)
        .map_err(|source| DataError::Io { path: input.file.path.clone(), source })?;
    Ok(Some((meta.len(), meta.modified().ok())))
}

fn check_stamp(input: &Input) -> Result<(), DataError> {
    let now = stamp_of(input)?;
    if now != input.stamp {
        return Err(DataError::Changed {
            path: input.file.path.clone(),
            reason: "its size or modification time differs from when it was indexed".into(),
        });
    }
    Ok(())
}

/// The record fields each format reads from a table, and what their columns must hold.
fn field_specs(format: DataFormat) -> &'static [FieldSpec] {
    const fn f(field: &'static str, required: bool, kind: ColumnKind) -> FieldSpec {
        FieldSpec { field, required, kind }
    }
    const CHAT: &[FieldSpec] = &[f("messages", true, ColumnKind::List), f("tools", false, ColumnKind::TextOrList)];
    const INSTRUCTION: &[FieldSpec] = &[
        f("instruction", true, ColumnKind::Text),
        f("input", false, ColumnKind::Text),
        f("output", true, ColumnKind::Text),
        f("system", false, ColumnKind::Text),
    ];
    const TEXT: &[FieldSpec] = &[f("text", true, ColumnKind::Text)];
    const PREFERENCE: &[FieldSpec] = &[
        f("prompt", true, ColumnKind::TextOrList),
        f("chosen", true, ColumnKind::TextOrList),
        f("rejected", true, ColumnKind::TextOrList),
        f("tools", false, ColumnKind::TextOrList),
    ];
    match format {
        DataFormat::Chat => CHAT,
        DataFormat::Instruction => INSTRUCTION,
        DataFormat::Text => TEXT,
        DataFormat::Preference => PREFERENCE,
    }
}

/// The record fields of `format` (what `data.columns` may map).
pub fn format_fields(format: DataFormat) -> Vec<&'static str> {
    field_specs(format).iter().map(|s| s.field).collect()
}
