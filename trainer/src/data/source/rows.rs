//! Every row of one data file as a record of the named columns: how benchmark task data
//! (small test splits, read whole) are read, through the same Parquet/Arrow/JSONL readers as
//! training data.

use super::files::{FileKind, InputFile};
use super::table::{ColumnKind, FieldSpec, Table};
use crate::data::error::DataError;
use crate::data::json::Json;

/// The rows of `file`, each an object of the `columns` it has (a column missing from the file
/// is an error naming the file and the columns it has).
pub fn read_rows(file: &InputFile, columns: &[&'static str]) -> Result<Vec<Json>, DataError> {
    if file.kind == FileKind::Jsonl {
        return read_jsonl(file, columns);
    }
    let fields: Vec<FieldSpec> =
        columns.iter().map(|&field| FieldSpec { field, required: true, kind: ColumnKind::Any }).collect();
    let table = Table::open(file, &fields, &[])?;
    let mut rows = Vec::new();
    for group in 0..table.groups() {
        table.read_group(group, &mut |_, batch| {
            rows.extend((0..batch.num_rows()).map(|i| table.record(&batch, i)));
            Ok(())
        })?;
    }
    Ok(rows)
}

fn read_jsonl(file: &InputFile, columns: &[&'static str]) -> Result<Vec<Json>, DataError> {
    let text =
        std::fs::read_to_string(&file.path).map_err(|source| DataError::Io { path: file.path.clone(), source })?;
    let bad = |line: usize, message: String| DataError::Config(format!("{}:{line}: {message}", file.path.display()));
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let Json::Object(fields) = Json::parse(line).map_err(|e| bad(i + 1, e))? else {
            return Err(bad(i + 1, "not a JSON object".into()));
        };
        let mut kept = Vec::new();
        for &column in columns {
            let value = fields.iter().find(|(k, _)| k == column).map(|(_, v)| v.clone());
            kept.push((column.to_owned(), value.ok_or_else(|| bad(i + 1, format!("no field `{column}`")))?));
        }
        rows.push(Json::Object(kept));
    }
    Ok(rows)
}
