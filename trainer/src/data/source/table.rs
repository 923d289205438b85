//! Parquet and Arrow IPC files, read a block of rows at a time through the Arrow crates.
//!
//! A file's *groups* are its Parquet row groups or its Arrow record batches; a group is read
//! in blocks of at most [`BLOCK_ROWS`] rows, and only the columns the record format uses. A
//! block is read again on its own later (Parquet: the row group with a row selection; Arrow
//! files: the record batch by index; Arrow streams: the schema, dictionary and batch messages
//! at the byte offsets found when the file was opened), so no file is ever held whole.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_ipc::reader::{FileReader, StreamDecoder};
use arrow_schema::{DataType, SchemaRef};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder, RowSelection, RowSelector,
};

use super::arrow_json::{cell, describe, supported};
use super::files::{FileKind, InputFile};
use crate::data::error::{DataError, TableError};
use crate::data::json::Json;

/// Rows per block: what is decoded, tokenized and cached at once.
pub const BLOCK_ROWS: usize = 1024;

/// A record field the format reads, and whether a record must have it.
#[derive(Debug, Clone, Copy)]
pub struct FieldSpec {
    pub field: &'static str,
    pub required: bool,
    pub kind: ColumnKind,
}

/// What a column of a field must hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnKind {
    Text,
    List,
    TextOrList,
    /// Any type the records can hold (numbers too): benchmark task data.
    Any,
}

enum Reader {
    Parquet(ArrowReaderMetadata),
    IpcFile,
    /// Byte ranges of the schema message, of each dictionary message (with the batch it
    /// precedes), and of each record batch message.
    IpcStream {
        schema: (u64, u64),
        dictionaries: Vec<(usize, u64, u64)>,
        batches: Vec<(u64, u64)>,
    },
}

/// An opened Parquet or Arrow file and the columns it is read by.
pub struct Table {
    pub path: PathBuf,
    reader: Reader,
    /// (record field, column name) of the columns read, and each column's index in the file.
    columns: Vec<(&'static str, String, usize)>,
    /// Rows per group.
    group_rows: Vec<u64>,
}

impl Table {
    /// Opens `file` and checks that it has the columns `fields` need (named as `mapping` says,
    /// else as the field), of a kind they can be.
    pub fn open(file: &InputFile, fields: &[FieldSpec], mapping: &[(String, String)]) -> Result<Table, DataError> {
        let path = file.path.clone();
        let bad = |message: String| {
            DataError::BadTable(Box::new(TableError {
                path: path.clone(),
                group: None,
                column: None,
                row: None,
                message,
            }))
        };
        let (reader, schema, group_rows) = match file.kind {
            FileKind::Parquet => {
                let f = open(&path)?;
                let meta = ArrowReaderMetadata::load(&f, ArrowReaderOptions::new())
                    .map_err(|e| bad(format!("not a readable Parquet file: {e}")))?;
                let rows = meta.metadata().row_groups().iter().map(|g| g.num_rows().max(0) as u64).collect();
                let schema = meta.schema().clone();
                (Reader::Parquet(meta), schema, rows)
            }
            FileKind::ArrowFile => {
                let mut reader = FileReader::try_new(open(&path)?, None)
                    .map_err(|e| bad(format!("not a readable Arrow file: {e}")))?;
                let schema = reader.schema();
                let mut rows = Vec::with_capacity(reader.num_batches());
                // The footer has no row counts: count them once, batch by batch.
                for i in 0..reader.num_batches() {
                    reader.set_index(i).map_err(|e| bad(format!("record batch {i}: {e}")))?;
                    let batch = reader.next().transpose().map_err(|e| bad(format!("record batch {i}: {e}")))?;
                    rows.push(batch.map_or(0, |b| b.num_rows() as u64));
                }
                (Reader::IpcFile, schema, rows)
            }
            FileKind::ArrowStream => {
                let (reader, schema, rows) = scan_stream(&path).map_err(bad)?;
                (reader, schema, rows)
            }
            FileKind::Jsonl => return Err(bad("a JSONL file is not a table".into())),
        };
        let available: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        let mut columns = Vec::new();
        for spec in fields {
            let mapped = mapping.iter().find(|(f, _)| f == spec.field).map(|(_, c)| c.as_str());
            let name = mapped.unwrap_or(spec.field);
            let Some(index) = available.iter().position(|c| *c == name) else {
                if spec.required || mapped.is_some() {
                    let hint = if mapped.is_some() {
                        String::new()
                    } else {
                        format!(" (map another with data.columns.{})", spec.field)
                    };
                    return Err(DataError::BadTable(Box::new(TableError {
                        path: path.clone(),
                        group: None,
                        column: Some(name.to_owned()),
                        row: None,
                        message: format!("no such column{hint}; the file has: {}", available.join(", ")),
                    })));
                }
                continue;
            };
            let ty = schema.field(index).data_type();
            let kind_ok = match spec.kind {
                ColumnKind::Text => is_text(ty),
                ColumnKind::List => is_list(ty),
                ColumnKind::TextOrList => is_text(ty) || is_list(ty),
                ColumnKind::Any => true,
            };
            if !kind_ok || !supported(ty) {
                let want = match spec.kind {
                    ColumnKind::Text => "strings",
                    ColumnKind::List => "lists",
                    ColumnKind::TextOrList => "strings or lists",
                    ColumnKind::Any => "values of a type JSON holds",
                };
                return Err(DataError::BadTable(Box::new(TableError {
                    path: path.clone(),
                    group: None,
                    column: Some(name.to_owned()),
                    row: None,
                    message: format!("expected {want} for `{}`, found {}", spec.field, describe(ty)),
                })));
            }
            columns.push((spec.field, name.to_owned(), index));
        }
        Ok(Table { path, reader, columns, group_rows })
    }

    pub fn groups(&self) -> usize {
        self.group_rows.len()
    }

    /// How errors name a group: `row group 3`, `record batch 3`.
    pub fn group_label(&self, group: usize) -> String {
        match self.reader {
            Reader::Parquet(_) => format!("row group {group}"),
            Reader::IpcFile | Reader::IpcStream { .. } => format!("record batch {group}"),
        }
    }

    /// Reads all of `group` in blocks of at most [`BLOCK_ROWS`] rows, in order: `visit(first
    /// row, block)`.
    pub fn read_group(
        &self,
        group: usize,
        visit: &mut dyn FnMut(u64, RecordBatch) -> Result<(), DataError>,
    ) -> Result<(), DataError> {
        let total = self.group_rows[group];
        let fail = |message: String| self.locate(group, 0, total as usize, message);
        match &self.reader {
            Reader::Parquet(meta) => {
                let mask = ProjectionMask::roots(meta.parquet_schema(), self.columns.iter().map(|c| c.2));
                let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(open(&self.path)?, meta.clone())
                    .with_row_groups(vec![group])
                    .with_projection(mask)
                    .with_batch_size(BLOCK_ROWS)
                    .build()
                    .map_err(|e| fail(e.to_string()))?;
                let mut first = 0;
                for batch in reader {
                    let batch = batch.map_err(|e| fail(e.to_string()))?;
                    let n = batch.num_rows() as u64;
                    visit(first, batch)?;
                    first += n;
                }
                if first != total {
                    return Err(fail(format!("{first} rows read, the footer says {total}")));
                }
            }
            Reader::IpcFile | Reader::IpcStream { .. } => {
                let whole = self.read(group, 0, total as usize)?;
                let mut first = 0;
                while first < total {
                    let n = (total - first).min(BLOCK_ROWS as u64);
                    visit(first, whole.slice(first as usize, n as usize))?;
                    first += n;
                }
            }
        }
        Ok(())
    }

    /// Reads rows `first..first + rows` of `group` (the used columns only).
    pub fn read(&self, group: usize, first: u64, rows: usize) -> Result<RecordBatch, DataError> {
        self.read_columns(group, first, rows, None).map_err(|message| self.locate(group, first, rows, message))
    }

    fn read_columns(&self, group: usize, first: u64, rows: usize, only: Option<usize>) -> Result<RecordBatch, String> {
        let indices: Vec<usize> = match only {
            Some(i) => vec![i],
            None => self.columns.iter().map(|c| c.2).collect(),
        };
        let whole = match &self.reader {
            Reader::Parquet(meta) => {
                let f = open(&self.path).map_err(|e| e.to_string())?;
                let mask = ProjectionMask::roots(meta.parquet_schema(), indices.iter().copied());
                let selection = RowSelection::from(vec![RowSelector::skip(first as usize), RowSelector::select(rows)]);
                let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(f, meta.clone())
                    .with_row_groups(vec![group])
                    .with_projection(mask)
                    .with_row_selection(selection)
                    .with_batch_size(rows.max(1))
                    .build()
                    .map_err(|e| e.to_string())?;
                let batches: Vec<RecordBatch> = reader.collect::<Result<_, _>>().map_err(|e| e.to_string())?;
                return concat(batches, rows);
            }
            Reader::IpcFile => {
                let mut reader = FileReader::try_new(open(&self.path).map_err(|e| e.to_string())?, Some(indices))
                    .map_err(|e| e.to_string())?;
                reader.set_index(group).map_err(|e| e.to_string())?;
                reader.next().transpose().map_err(|e| e.to_string())?.ok_or("the record batch is missing")?
            }
            Reader::IpcStream { schema, dictionaries, batches } => {
                let mut decoder = StreamDecoder::new();
                let mut file = open(&self.path).map_err(|e| e.to_string())?;
                let mut ranges = vec![*schema];
                ranges.extend(dictionaries.iter().filter(|d| d.0 <= group).map(|d| (d.1, d.2)));
                ranges.push(*batches.get(group).ok_or("the record batch is missing")?);
                let mut out = None;
                for (offset, len) in ranges {
                    let mut bytes = vec![0u8; len as usize];
                    file.seek(SeekFrom::Start(offset)).map_err(|e| e.to_string())?;
                    file.read_exact(&mut bytes).map_err(|e| format!("truncated: {e}"))?;
                    let mut buffer = arrow_buffer::Buffer::from(bytes);
                    while !buffer.is_empty() {
                        match decoder.decode(&mut buffer).map_err(|e| e.to_string())? {
                            Some(batch) => out = Some(batch),
                            None if buffer.is_empty() => break,
                            None => {}
                        }
                    }
                }
                let batch = out.ok_or("the record batch did not decode")?;
                batch.project(&indices).map_err(|e| e.to_string())?
            }
        };
        let first = first as usize;
        if first + rows > whole.num_rows() {
            return Err(format!("has {} rows, not {}", whole.num_rows(), first + rows));
        }
        Ok(whole.slice(first, rows))
    }

    /// The error of a failed read, with the column that fails to read alone when one does.
    fn locate(&self, group: usize, first: u64, rows: usize, message: String) -> DataError {
        let column = self
            .columns
            .iter()
            .find(|c| self.read_columns(group, first, rows, Some(c.2)).is_err())
            .map(|c| c.1.clone());
        DataError::BadTable(Box::new(TableError {
            path: self.path.clone(),
            group: Some(self.group_label(group)),
            column,
            row: None,
            message: format!("corrupt or unreadable: {message}"),
        }))
    }

    /// Row `i` of a block as a record: `{field: value}` for the columns read.
    pub fn record(&self, batch: &RecordBatch, i: usize) -> Json {
        let fields = self
            .columns
            .iter()
            .filter_map(|(field, name, _)| {
                let array = batch.column_by_name(name)?;
                let mut value = cell(array, i);
                // Datasets often store tool schemas as one JSON string.
                if *field == "tools"
                    && let Json::String(s) = &value
                {
                    value = Json::parse(s).unwrap_or(value);
                }
                Some((field.to_string(), value))
            })
            .collect();
        Json::Object(fields)
    }

    /// The column a record field is read from.
    pub fn column_of(&self, field: &str) -> Option<&str> {
        self.columns.iter().find(|c| c.0 == field).map(|c| c.1.as_str())
    }
}

fn open(path: &std::path::Path) -> Result<File, DataError> {
    File::open(path).map_err(|source| DataError::Io { path: path.to_owned(), source })
}

fn concat(batches: Vec<RecordBatch>, rows: usize) -> Result<RecordBatch, String> {
    let Some(schema) = batches.first().map(RecordBatch::schema) else {
        return Err("no rows came back".into());
    };
    let batch = arrow_select::concat::concat_batches(&schema, &batches).map_err(|e| e.to_string())?;
    if batch.num_rows() != rows {
        return Err(format!("{} rows came back, not {rows}", batch.num_rows()));
    }
    Ok(batch)
}

fn is_text(ty: &DataType) -> bool {
    match ty {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null => true,
        DataType::Dictionary(_, v) => is_text(v),
        _ => false,
    }
}

fn is_list(ty: &DataType) -> bool {
    matches!(
        ty,
        DataType::List(_)
            | DataType::LargeList(_)
            | DataType::FixedSizeList(..)
            | DataType::ListView(_)
            | DataType::Null
    )
}

/// Walks an Arrow IPC stream's messages (continuation marker, metadata length, flatbuffer
/// metadata, body) without decoding bodies: the byte range of each, and every batch's rows.
fn scan_stream(path: &std::path::Path) -> Result<(Reader, SchemaRef, Vec<u64>), String> {
    let mut file = File::open(path).map_err(|e| e.to_string())?;
    let size = file.metadata().map_err(|e| e.to_string())?.len();
    let mut at = 0u64;
    let (mut schema_range, mut dictionaries, mut batches, mut rows) = (None, Vec::new(), Vec::new(), Vec::new());
    let mut schema = None;
    while at + 4 <= size {
        let start = at;
        let mut word = [0u8; 4];
        file.seek(SeekFrom::Start(at)).map_err(|e| e.to_string())?;
        file.read_exact(&mut word).map_err(|e| e.to_string())?;
        at += 4;
        let mut len = u32::from_le_bytes(word);
        if len == 0xFFFF_FFFF {
            file.read_exact(&mut word).map_err(|e| format!("truncated at byte {at}: {e}"))?;
            at += 4;
            len = u32::from_le_bytes(word);
        }
        if len == 0 {
            break; // end-of-stream marker
        }
        let mut meta = vec![0u8; len as usize];
        file.read_exact(&mut meta).map_err(|e| format!("truncated message at byte {start}: {e}"))?;
        at += u64::from(len);
        let message =
            arrow_ipc::root_as_message(&meta).map_err(|e| format!("not an Arrow IPC stream (byte {start}): {e}"))?;
        let body = u64::try_from(message.bodyLength()).map_err(|_| format!("bad body length at byte {start}"))?;
        if at + body > size {
            return Err(format!("truncated: the message at byte {start} runs past the end of the file"));
        }
        at += body;
        let range = (start, at - start);
        match message.header_type() {
            arrow_ipc::MessageHeader::Schema => {
                // From the metadata itself: a StreamDecoder given the schema message alone stops
                // before its (empty) body and reports no schema.
                let fb = message.header_as_schema().ok_or_else(|| format!("bad schema message at byte {start}"))?;
                schema_range = Some(range);
                let decoded =
                    arrow_ipc::convert::try_fb_to_schema(fb).map_err(|e| format!("bad schema at byte {start}: {e}"))?;
                schema = Some(Arc::new(decoded));
            }
            arrow_ipc::MessageHeader::DictionaryBatch => dictionaries.push((batches.len(), range.0, range.1)),
            arrow_ipc::MessageHeader::RecordBatch => {
                let count = message.header_as_record_batch().map_or(0, |b| b.length().max(0) as u64);
                batches.push(range);
                rows.push(count);
            }
            other => return Err(format!("unexpected message {other:?} at byte {start}")),
        }
    }
    let (schema_range, schema) = schema_range.zip(schema).ok_or("not an Arrow IPC stream: no schema message")?;
    Ok((Reader::IpcStream { schema: schema_range, dictionaries, batches }, schema, rows))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{ArrayRef, StringArray};
    use arrow_ipc::writer::StreamWriter;
    use arrow_schema::{Field, Schema};

    /// A stream as `datasets` writes one (schema message, then record batches) scans to its
    /// schema and every batch's rows.
    #[test]
    fn a_stream_scans_to_its_schema_and_batches() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data-00000-of-00001.arrow");
        let schema = Arc::new(Schema::new(vec![Field::new("text", DataType::Utf8, false)]));
        let mut w = StreamWriter::try_new(File::create(&path).unwrap(), &schema).unwrap();
        for rows in [vec!["a", "b"], vec!["c", "d", "e"]] {
            let column: ArrayRef = Arc::new(StringArray::from(rows));
            w.write(&RecordBatch::try_new(schema.clone(), vec![column]).unwrap()).unwrap();
        }
        w.finish().unwrap();
        let (_, scanned, rows) = scan_stream(&path).unwrap();
        assert_eq!(scanned.fields().len(), 1);
        assert_eq!(scanned.field(0).name(), "text");
        assert_eq!(rows, [2, 3]);
    }
}
