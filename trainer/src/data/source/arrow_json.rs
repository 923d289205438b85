//! One cell of an Arrow column as a [`Json`] value, so that table rows go through the same
//! record checks as JSONL lines.
//!
//! Struct fields that are null are left out: Arrow gives every row of a struct column every
//! field that any row has (a tool call's `arguments` for one tool gets the other tools' keys as
//! nulls), and a missing key is what the data meant.

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float16Type, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type,
    UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrayRef};
use arrow_schema::DataType;

use crate::data::json::Json;

/// Whether values of `ty` can be read as JSON.
pub fn supported(ty: &DataType) -> bool {
    match ty {
        DataType::Null
        | DataType::Boolean
        | DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::UInt64
        | DataType::Float16
        | DataType::Float32
        | DataType::Float64
        | DataType::Utf8
        | DataType::LargeUtf8
        | DataType::Utf8View => true,
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) | DataType::ListView(f) => {
            supported(f.data_type())
        }
        DataType::Struct(fields) => fields.iter().all(|f| supported(f.data_type())),
        DataType::Map(entries, _) => supported(entries.data_type()),
        DataType::Dictionary(_, values) => supported(values),
        _ => false,
    }
}

/// The JSON kind a column of `ty` holds, for error messages.
pub fn describe(ty: &DataType) -> String {
    match ty {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "strings".into(),
        DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(..) | DataType::ListView(_) => {
            format!("lists ({ty})")
        }
        DataType::Struct(_) | DataType::Map(..) => format!("objects ({ty})"),
        DataType::Dictionary(_, v) => describe(v),
        other => format!("{other}"),
    }
}

/// Row `i` of `array`.
pub fn cell(array: &ArrayRef, i: usize) -> Json {
    if array.is_null(i) {
        return Json::Null;
    }
    match array.data_type() {
        DataType::Boolean => Json::Bool(array.as_boolean().value(i)),
        DataType::Int8 => Json::Int(array.as_primitive::<Int8Type>().value(i).into()),
        DataType::Int16 => Json::Int(array.as_primitive::<Int16Type>().value(i).into()),
        DataType::Int32 => Json::Int(array.as_primitive::<Int32Type>().value(i).into()),
        DataType::Int64 => Json::Int(array.as_primitive::<Int64Type>().value(i).into()),
        DataType::UInt8 => Json::Int(array.as_primitive::<UInt8Type>().value(i).into()),
        DataType::UInt16 => Json::Int(array.as_primitive::<UInt16Type>().value(i).into()),
        DataType::UInt32 => Json::Int(array.as_primitive::<UInt32Type>().value(i).into()),
        DataType::UInt64 => Json::Int(array.as_primitive::<UInt64Type>().value(i).into()),
        DataType::Float16 => Json::Float(array.as_primitive::<Float16Type>().value(i).to_f64()),
        DataType::Float32 => Json::Float(array.as_primitive::<Float32Type>().value(i).into()),
        DataType::Float64 => Json::Float(array.as_primitive::<Float64Type>().value(i)),
        DataType::Utf8 => Json::String(array.as_string::<i32>().value(i).to_owned()),
        DataType::LargeUtf8 => Json::String(array.as_string::<i64>().value(i).to_owned()),
        DataType::Utf8View => Json::String(array.as_string_view().value(i).to_owned()),
        DataType::List(_) => items(&array.as_list::<i32>().value(i)),
        DataType::LargeList(_) => items(&array.as_list::<i64>().value(i)),
        DataType::FixedSizeList(..) => items(&array.as_fixed_size_list().value(i)),
        DataType::ListView(_) => items(&array.as_list_view::<i32>().value(i)),
        DataType::Struct(_) => {
            let s = array.as_struct();
            let fields = s
                .fields()
                .iter()
                .zip(s.columns())
                .map(|(f, col)| (f.name().clone(), cell(col, i)))
                .filter(|(_, v)| *v != Json::Null)
                .collect();
            Json::Object(fields)
        }
        DataType::Map(..) => {
            let entries = array.as_map().value(i);
            let (keys, values) = (entries.column(0), entries.column(1));
            let fields = (0..entries.len())
                .map(|j| {
                    let key = match cell(keys, j) {
                        Json::String(s) => s,
                        other => other.to_python_json(),
                    };
                    (key, cell(values, j))
                })
                .collect();
            Json::Object(fields)
        }
        DataType::Dictionary(..) => {
            let dict = array.as_any_dictionary();
            let key = dict.normalized_keys()[i];
            cell(dict.values(), key)
        }
        // `supported` refused every other type when the file was opened.
        _ => Json::Null,
    }
}

fn items(values: &ArrayRef) -> Json {
    Json::Array((0..values.len()).map(|j| cell(values, j)).collect())
}
