//! transformers' `tojson` filter for chat templates: `json.dumps(x, ensure_ascii=False,
//! indent=None, separators=None, sort_keys=False)`, written by hand so that key order, float
//! digits, separators and escapes are Python's, byte for byte (minijinja's own `tojson`
//! sorts nothing but escapes `<`, `>` and `'` for HTML, which chat templates must not see).

use std::fmt::Write;

use minijinja::value::{Kwargs, Rest, ValueKind};
use minijinja::{Error, ErrorKind, Value};

use crate::data::json::{python_float_repr, write_python_str};

/// The options of Python's `json.dumps` that transformers' filter passes through.
struct Style {
    ensure_ascii: bool,
    indent: Option<String>,
    item_separator: String,
    key_separator: String,
    sort_keys: bool,
}

/// `value | tojson(ensure_ascii=False, indent=None, separators=None, sort_keys=False)`, with
/// the arguments positional or by name as in transformers' Python signature.
pub(super) fn tojson(value: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let arg = |i: usize, name: &str| -> Result<Option<Value>, Error> {
        let named: Option<Value> = kwargs.get(name)?;
        Ok(named.or_else(|| args.get(i).cloned()).filter(|v| !v.is_none() && !v.is_undefined()))
    };
    let ensure_ascii = arg(0, "ensure_ascii")?.is_some_and(|v| v.is_true());
    let indent = match arg(1, "indent")? {
        None => None,
        Some(v) if v.kind() == ValueKind::Number => {
            let n = i64::try_from(v.clone()).map_err(|_| invalid("tojson: indent must be an integer or a string"))?;
            Some(" ".repeat(n.max(0) as usize))
        }
        Some(v) => Some(v.as_str().ok_or_else(|| invalid("tojson: indent must be an integer or a string"))?.to_owned()),
    };
    let (item_separator, key_separator) = match arg(2, "separators")? {
        Some(seps) => {
            let parts: Vec<String> = seps
                .try_iter()?
                .map(|s| s.as_str().map(str::to_owned).ok_or_else(|| invalid("tojson: separators must be strings")))
                .collect::<Result<_, _>>()?;
            match <[String; 2]>::try_from(parts) {
                Ok([item, key]) => (item, key),
                Err(_) => return Err(invalid("tojson: separators must be a pair (item, key)")),
            }
        }
        None if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
    };
    let sort_keys = arg(3, "sort_keys")?.is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;
    let style = Style { ensure_ascii, indent, item_separator, key_separator, sort_keys };
    let mut out = String::new();
    write_value(value, &style, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

fn invalid(message: &str) -> Error {
    Error::new(ErrorKind::InvalidOperation, message.to_owned())
}

fn newline(style: &Style, level: usize, out: &mut String) {
    if let Some(indent) = &style.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(indent);
        }
    }
}

fn write_value(value: &Value, style: &Style, level: usize, out: &mut String) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number if value.is_integer() => {
            let _ = write!(out, "{value}");
        }
        ValueKind::Number => {
            let f = f64::try_from(value.clone()).map_err(|_| invalid("tojson: a number out of range"))?;
            out.push_str(&python_float_repr(f));
        }
        ValueKind::String => write_python_str(value.as_str().unwrap_or_default(), style.ensure_ascii, out),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_separator);
                }
                newline(style, level + 1, out);
                write_value(item, style, level + 1, out)?;
            }
            newline(style, level, out);
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if style.sort_keys {
                keys.sort_by_key(|a| a.to_string());
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_separator);
                }
                newline(style, level + 1, out);
                // Python writes non-string keys (numbers, booleans) as their string form.
                let name = match key.as_str() {
                    Some(s) => s.to_owned(),
                    None => key.to_string(),
                };
                write_python_str(&name, style.ensure_ascii, out);
                out.push_str(&style.key_separator);
                write_value(&value.get_item(key)?, style, level + 1, out)?;
            }
            newline(style, level, out);
            out.push('}');
        }
        other => {
            return Err(invalid(&format!("tojson: a value of kind {other} is not JSON serializable")));
        }
    }
    Ok(())
}
