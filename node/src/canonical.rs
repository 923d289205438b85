//! RFC 8785 JSON Canonicalization Scheme (JCS).
//!
//! Event hashes and signatures cover these bytes, so two implementations that agree
//! on JCS agree on every hash. The rules: no whitespace; object members sorted by the
//! UTF-16 code units of their names; strings escaped minimally (only `"`, `\` and
//! control characters); numbers in ECMAScript `Number.prototype.toString` form.
//!
//! JCS models every number as an IEEE-754 double. An integer beyond ±2^53 cannot
//! round-trip through a double, so rather than silently change its value we refuse
//! it: such quantities (token amounts, say) belong in strings.
//!
//! ```
//! use serde_json::json;
//! let bytes = mindxtrain_node::canonical::to_vec(&json!({"b": 1.50, "a": [true, null]})).unwrap();
//! assert_eq!(bytes, br#"{"a":[true,null],"b":1.5}"#);
//! ```

use serde_json::{Map, Number, Value};
use thiserror::Error;

/// Largest integer a double holds exactly.
const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CanonicalError {
    #[error("number {0} is outside ±(2^53-1) and cannot be canonicalised exactly; encode it as a string")]
    UnsafeInteger(String),
    #[error("number {0} is not finite")]
    NonFinite(String),
}

/// Canonical bytes of `value`.
pub fn to_vec(value: &Value) -> Result<Vec<u8>, CanonicalError> {
    let mut out = Vec::with_capacity(128);
    write_value(value, &mut out)?;
    Ok(out)
}

/// Appends the canonical form of `value` to `out`.
pub fn write_value(value: &Value, out: &mut Vec<u8>) -> Result<(), CanonicalError> {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => write_number(n, out)?,
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(item, out)?;
            }
            out.push(b']');
        }
        Value::Object(map) => write_object(map, out)?,
    }
    Ok(())
}

fn write_object(map: &Map<String, Value>, out: &mut Vec<u8>) -> Result<(), CanonicalError> {
    let mut entries: Vec<(&String, &Value)> = map.iter().collect();
    // UTF-16 order differs from UTF-8 byte order only for code points above U+FFFF
    // against U+E000..U+FFFF; compare code units so both cases come out right.
    entries.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
    out.push(b'{');
    for (i, (k, v)) in entries.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_string(k, out);
        out.push(b':');
        write_value(v, out)?;
    }
    out.push(b'}');
    Ok(())
}

fn write_number(n: &Number, out: &mut Vec<u8>) -> Result<(), CanonicalError> {
    if let Some(digits) =
        n.as_u64().map(|u| (u, u.to_string())).or_else(|| n.as_i64().map(|i| (i.unsigned_abs(), i.to_string())))
    {
        let (magnitude, text) = digits;
        // Beyond 2^53 an integer is acceptable only when it is already the shortest
        // form of a double (as a large integral double prints); anything else would
        // change value on its way through an IEEE-754 implementation.
        if magnitude > MAX_SAFE_INTEGER && !is_shortest_double(&text) {
            return Err(CanonicalError::UnsafeInteger(text));
        }
        out.extend_from_slice(text.as_bytes());
    } else {
        let f = n.as_f64().ok_or_else(|| CanonicalError::NonFinite(n.to_string()))?;
        if !f.is_finite() {
            return Err(CanonicalError::NonFinite(n.to_string()));
        }
        if f == 0.0 {
            // ECMAScript prints -0 as "0".
            out.push(b'0');
        } else {
            let mut buf = ryu_js::Buffer::new();
            out.extend_from_slice(buf.format_finite(f).as_bytes());
        }
    }
    Ok(())
}

fn is_shortest_double(text: &str) -> bool {
    text.parse::<f64>().is_ok_and(|f| f.is_finite() && ryu_js::Buffer::new().format_finite(f) == text)
}

fn write_string(s: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: Option<&[u8]> = match b {
            b'"' => Some(b"\\\""),
            b'\\' => Some(b"\\\\"),
            0x08 => Some(b"\\b"),
            0x09 => Some(b"\\t"),
            0x0a => Some(b"\\n"),
            0x0c => Some(b"\\f"),
            0x0d => Some(b"\\r"),
            0x00..=0x1f => None,
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        match escape {
            Some(e) => out.extend_from_slice(e),
            None => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX[(b >> 4) as usize]);
                out.push(HEX[(b & 0xf) as usize]);
            }
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn canon(v: &Value) -> String {
        String::from_utf8(to_vec(v).unwrap()).unwrap()
    }

    #[test]
    fn numbers_follow_ecmascript() {
        // Values from RFC 8785 appendix B and ECMA-262 Number::toString.
        let cases: &[(f64, &str)] = &[
            (0.0, "0"),
            (-0.0, "0"),
            (1.0, "1"),
            (4.5, "4.5"),
            (0.002, "0.002"),
            (0.000001, "0.000001"),
            (1e-7, "1e-7"),
            (1e21, "1e+21"),
            (1e20, "100000000000000000000"),
            (1e30, "1e+30"),
            (-1.5e-9, "-1.5e-9"),
            (123456789.125, "123456789.125"),
            (5e-324, "5e-324"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
        ];
        for (f, want) in cases {
            assert_eq!(canon(&json!(f)), *want, "{f}");
        }
    }

    #[test]
    fn rfc8785_example_object() {
        // RFC 8785 §3.2.2 sample, with its literal values.
        let v: Value = serde_json::from_str(
            r#"{"numbers":[333333333.33333329,1E30,4.50,2e-3,0.000000000000000000000000001],
                "string":"\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
                "literals":[null,true,false]}"#,
        )
        .unwrap();
        assert_eq!(
            canon(&v),
            r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#
        );
    }

    #[test]
    fn keys_sort_by_utf16_code_units() {
        // U+1F600 (surrogates D83D..) sorts before U+FFFD in UTF-16, after it in UTF-8.
        let v = json!({"\u{fffd}": 1, "\u{1f600}": 2, "a": 3, "": 4});
        assert_eq!(canon(&v), "{\"\":4,\"a\":3,\"\u{1f600}\":2,\"\u{fffd}\":1}");
    }

    #[test]
    fn unsafe_integers_are_refused() {
        assert!(to_vec(&json!(9007199254740991u64)).is_ok());
        assert!(matches!(to_vec(&json!(-9007199254740993i64)), Err(CanonicalError::UnsafeInteger(_))));
        assert!(matches!(to_vec(&json!(9007199254740993u64)), Err(CanonicalError::UnsafeInteger(_))));
        // A large integral double prints as digits and is its own canonical form.
        assert_eq!(to_vec(&json!(1447728474958849000u64)).unwrap(), b"1447728474958849000");
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            (-(1i64 << 53) + 1..(1i64 << 53)).prop_map(|i| json!(i)),
            any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(|f| json!(f)),
            ".*".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 64, 8, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
                proptest::collection::btree_map(".*", inner, 0..8).prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn canonical_form_parses_back_and_is_a_fixed_point(v in arb_json()) {
            let bytes = to_vec(&v).unwrap();
            let back: Value = serde_json::from_slice(&bytes).unwrap();
            // Doubles survive their shortest round-trip form exactly.
            prop_assert_eq!(to_vec(&back).unwrap(), bytes);
        }
    }
}
