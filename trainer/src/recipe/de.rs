//! A serde `Deserializer` over the located YAML tree.
//!
//! Every error leaves here carrying the line:col and field path of the node it was raised
//! for, so unknown fields, wrong types, missing fields and unknown enum values all point at
//! the file. Enums whose Deserialize passes [`KIND_TAGGED`] as their name are read from a
//! mapping whose `kind` key names the variant; this replaces serde's internally tagged enums,
//! which buffer their input and would lose every location below the tag.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IntoDeserializer, Visitor};

use super::error::{FieldPath, Location};
use super::yaml::{Entry, Node, NodeKind, Resolved, resolve};

mod enums;

use enums::{TaggedEnum, UnitEnum};

/// Name a hand-written `Deserialize` passes to `deserialize_enum` to ask for `kind` tagging.
pub(crate) const KIND_TAGGED: &str = "mindxtrain::recipe::kind_tagged";
const TAG_KEY: &str = "kind";

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DeError {
    pub message: String,
    /// Set by `missing_field`: the path gets the field appended when the error is located.
    missing: Option<&'static str>,
    pub at: Option<(Location, FieldPath)>,
}

impl DeError {
    pub(crate) fn is_missing_field(&self) -> bool {
        self.missing.is_some()
    }

    /// Gives the error the location of the innermost node that saw it, never overwriting.
    fn located(mut self, loc: Location, path: &PathStack<'_>) -> Self {
        if self.at.is_none() {
            let mut p = path.to_path();
            if let Some(field) = self.missing {
                p = p.key(field);
            }
            self.at = Some((loc, p));
        }
        self
    }
}

impl fmt::Display for DeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for DeError {}

fn one_of(names: &'static [&'static str]) -> String {
    names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
}

impl de::Error for DeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        DeError { message: msg.to_string(), missing: None, at: None }
    }

    fn invalid_type(unexp: de::Unexpected<'_>, exp: &dyn de::Expected) -> Self {
        Self::custom(format_args!("expected {exp}, found {unexp}"))
    }

    fn invalid_value(unexp: de::Unexpected<'_>, exp: &dyn de::Expected) -> Self {
        Self::custom(format_args!("expected {exp}, found {unexp}"))
    }

    fn invalid_length(len: usize, exp: &dyn de::Expected) -> Self {
        Self::custom(format_args!("expected {exp}, found {len} items"))
    }

    fn unknown_variant(variant: &str, expected: &'static [&'static str]) -> Self {
        Self::custom(format_args!("unknown value `{variant}`; expected one of {}", one_of(expected)))
    }

    fn unknown_field(field: &str, expected: &'static [&'static str]) -> Self {
        if expected.is_empty() {
            return Self::custom(format_args!("unknown field `{field}`; this section takes no fields"));
        }
        Self::custom(format_args!("unknown field `{field}`; expected one of {}", one_of(expected)))
    }

    fn missing_field(field: &'static str) -> Self {
        DeError { message: format!("missing field `{field}`"), missing: Some(field), at: None }
    }

    fn duplicate_field(field: &'static str) -> Self {
        Self::custom(format_args!("duplicate field `{field}`"))
    }
}

/// The path to the node being read, kept on the stack as the deserializer descends.
pub(crate) enum PathStack<'a> {
    Root,
    Key(&'a PathStack<'a>, &'a str),
    Index(&'a PathStack<'a>, usize),
}

impl PathStack<'_> {
    fn to_path(&self) -> FieldPath {
        match self {
            PathStack::Root => FieldPath::default(),
            PathStack::Key(parent, k) => parent.to_path().key(k),
            PathStack::Index(parent, i) => parent.to_path().index(*i),
        }
    }
}

/// Deserializes one node. `loc` is where the field is written: its key for a mapping value.
pub(crate) struct De<'a> {
    pub node: &'a Node,
    pub loc: Location,
    pub path: &'a PathStack<'a>,
    /// The tag key of a `kind`-tagged enum, hidden from the variant's own fields.
    skip_tag: bool,
}

impl<'a> De<'a> {
    pub(crate) fn root(node: &'a Node, path: &'a PathStack<'a>) -> Self {
        De { node, loc: node.loc, path, skip_tag: false }
    }

    fn err(&self, message: String) -> DeError {
        de::Error::custom(message)
    }

    fn resolved(&self) -> Option<Resolved<'a>> {
        match &self.node.kind {
            NodeKind::Scalar { text, plain } => Some(resolve(text, *plain)),
            _ => None,
        }
    }

    fn describe(&self) -> String {
        match (&self.node.kind, self.resolved()) {
            (NodeKind::Map(_), _) => "a mapping".into(),
            (NodeKind::Seq(_), _) => "a list".into(),
            (_, Some(Resolved::Null)) => "an empty value (null)".into(),
            (_, Some(Resolved::Bool(b))) => format!("boolean `{b}`"),
            (_, Some(Resolved::Int(i))) => format!("integer `{i}`"),
            (_, Some(Resolved::HugeInt)) => "an integer too large for any field".into(),
            (_, Some(Resolved::Float(x))) => format!("float `{x:?}`"),
            (_, Some(Resolved::Str(s))) => format!("string {s:?}"),
            (_, None) => "nothing".into(),
        }
    }

    fn expected(&self, what: &str) -> DeError {
        self.err(format!("expected {what}, found {}", self.describe()))
    }

    fn int(&self, lo: i128, hi: i128) -> Result<i128, DeError> {
        match self.resolved() {
            Some(Resolved::Int(i)) if (lo..=hi).contains(&i) => Ok(i),
            Some(Resolved::Int(i)) => Err(self.err(format!("expected integer {lo}..={hi}, found {i}"))),
            _ => Err(self.expected("an integer")),
        }
    }

    fn finish<V>(&self, r: Result<V, DeError>) -> Result<V, DeError> {
        r.map_err(|e| e.located(self.loc, self.path))
    }

    fn entries(&self) -> Option<&'a [Entry]> {
        self.node.entries()
    }
}

macro_rules! int_method {
    ($method:ident, $ty:ty, $visit:ident, $wide:ty) => {
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
            let r = self.int(<$ty>::MIN as i128, <$ty>::MAX as i128).and_then(|i| {
                // The range check above makes the narrowing exact.
                visitor.$visit(i as $wide)
            });
            self.finish(r)
        }
    };
}

impl<'de> Deserializer<'de> for De<'_> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let r = match (&self.node.kind, self.resolved()) {
            (NodeKind::Map(_), _) => return self.deserialize_map(visitor),
            (NodeKind::Seq(_), _) => return self.deserialize_seq(visitor),
            (_, Some(Resolved::Null)) => visitor.visit_unit(),
            (_, Some(Resolved::Bool(b))) => visitor.visit_bool(b),
            (_, Some(Resolved::Int(i))) => visitor.visit_i128(i),
            (_, Some(Resolved::Float(x))) => visitor.visit_f64(x),
            (_, Some(Resolved::Str(s))) => visitor.visit_str(s),
            _ => Err(self.expected("a value")),
        };
        self.finish(r)
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let r = match self.resolved() {
            Some(Resolved::Bool(b)) => visitor.visit_bool(b),
            _ => Err(self.expected("a boolean (true or false)")),
        };
        self.finish(r)
    }

    int_method!(deserialize_i8, i8, visit_i64, i64);
    int_method!(deserialize_i16, i16, visit_i64, i64);
    int_method!(deserialize_i32, i32, visit_i64, i64);
    int_method!(deserialize_i64, i64, visit_i64, i64);
    int_method!(deserialize_u8, u8, visit_u64, u64);
    int_method!(deserialize_u16, u16, visit_u64, u64);
    int_method!(deserialize_u32, u32, visit_u64, u64);
    int_method!(deserialize_u64, u64, visit_u64, u64);

    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_f64(visitor)
    }

    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let r = match self.resolved() {
            Some(Resolved::Float(x)) => visitor.visit_f64(x),
            // Integers are exact in f64 up to 2^53, far beyond any recipe number.
            Some(Resolved::Int(i)) => visitor.visit_f64(i as f64),
            _ => Err(self.expected("a number")),
        };
        self.finish(r)
    }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let r = match (self.resolved(), &self.node.kind) {
            (Some(Resolved::Str(s)), _) => visitor.visit_str(s),
            (Some(Resolved::Null), _) => Err(self.expected("a string")),
            // A plain `1` or `true` is not text under YAML 1.2; say how to make it text.
            (Some(_), NodeKind::Scalar { text, .. }) => Err(self
                .err(format!("expected a string, found {}; quote it (\"{text}\") if text is meant", self.describe()))),
            _ => Err(self.expected("a string")),
        };
        self.finish(r)
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match self.resolved() {
            Some(Resolved::Null) => self.finish(visitor.visit_none()),
            _ => {
                let (loc, path) = (self.loc, self.path);
                visitor.visit_some(self).map_err(|e| e.located(loc, path))
            }
        }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let r = match self.resolved() {
            Some(Resolved::Null) => visitor.visit_unit(),
            _ => Err(self.expected("an empty value")),
        };
        self.finish(r)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(self, _name: &'static str, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _name: &'static str, visitor: V) -> Result<V::Value, DeError> {
        let (loc, path) = (self.loc, self.path);
        visitor.visit_newtype_struct(self).map_err(|e| e.located(loc, path))
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let r = match &self.node.kind {
            NodeKind::Seq(items) => visitor.visit_seq(SeqAcc { items, next: 0, path: self.path }),
            _ => Err(self.expected("a list")),
        };
        self.finish(r)
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, DeError> {
        let r = match &self.node.kind {
            NodeKind::Seq(items) if items.len() == len => visitor.visit_seq(SeqAcc { items, next: 0, path: self.path }),
            NodeKind::Seq(items) => {
                Err(self.err(format!("expected a list of {len} items, found {} items", items.len())))
            }
            _ => Err(self.expected(&format!("a list of {len} items"))),
        };
        self.finish(r)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        self.deserialize_tuple(len, visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let r = match self.entries() {
            Some(entries) => visitor.visit_map(MapAcc::new(entries, self.path, self.skip_tag)),
            None => Err(self.expected("a mapping")),
        };
        self.finish(r)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        let r = match self.entries() {
            Some(entries) => visitor.visit_map(MapAcc::new(entries, self.path, self.skip_tag)),
            None if fields.is_empty() => Err(self.expected("a mapping")),
            None => Err(self.expected(&format!("a mapping with fields {}", one_of(fields)))),
        };
        self.finish(r)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        let r = match (&self.node.kind, name == KIND_TAGGED) {
            (NodeKind::Scalar { .. }, false) => visitor.visit_enum(UnitEnum { de: &self }),
            (NodeKind::Map(entries), true) => match entries.iter().find(|e| e.key == TAG_KEY) {
                Some(tag) => visitor.visit_enum(TaggedEnum { de: &self, tag }),
                None => Err(de::Error::missing_field(TAG_KEY)),
            },
            (_, true) => Err(self.expected(&format!("a mapping with `kind: <one of {}>`", variants.join(" | ")))),
            (_, false) => Err(self.expected(&format!("one of {}", one_of(variants)))),
        };
        self.finish(r)
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let r = match &self.node.kind {
            NodeKind::Scalar { text, .. } => visitor.visit_str(text),
            _ => Err(self.expected("a name")),
        };
        self.finish(r)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_unit()
    }
}

struct SeqAcc<'a> {
    items: &'a [Node],
    next: usize,
    path: &'a PathStack<'a>,
}

impl<'de> de::SeqAccess<'de> for SeqAcc<'_> {
    type Error = DeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, DeError> {
        let Some(node) = self.items.get(self.next) else {
            return Ok(None);
        };
        let path = PathStack::Index(self.path, self.next);
        self.next += 1;
        seed.deserialize(De { node, loc: node.loc, path: &path, skip_tag: false })
            .map(Some)
            .map_err(|e| e.located(node.loc, &path))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.items.len() - self.next)
    }
}

struct MapAcc<'a> {
    entries: std::slice::Iter<'a, Entry>,
    current: Option<&'a Entry>,
    path: &'a PathStack<'a>,
    skip_tag: bool,
}

impl<'a> MapAcc<'a> {
    fn new(entries: &'a [Entry], path: &'a PathStack<'a>, skip_tag: bool) -> Self {
        MapAcc { entries: entries.iter(), current: None, path, skip_tag }
    }
}

impl<'de> de::MapAccess<'de> for MapAcc<'_> {
    type Error = DeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, DeError> {
        let entry = loop {
            match self.entries.next() {
                Some(e) if self.skip_tag && e.key == TAG_KEY => continue,
                Some(e) => break e,
                None => return Ok(None),
            }
        };
        self.current = Some(entry);
        let path = PathStack::Key(self.path, &entry.key);
        let key: de::value::StrDeserializer<'_, DeError> = entry.key.as_str().into_deserializer();
        seed.deserialize(key).map(Some).map_err(|e| e.located(entry.key_loc, &path))
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        let Some(entry) = self.current.take() else {
            return Err(de::Error::custom("value requested before its key"));
        };
        let path = PathStack::Key(self.path, &entry.key);
        // Errors a Deserialize impl raises after reading its value (a bad amount, a refused
        // policy) have not met a node yet; this is the field they belong to.
        seed.deserialize(De { node: &entry.value, loc: entry.key_loc, path: &path, skip_tag: false })
            .map_err(|e| e.located(entry.key_loc, &path))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.entries.len())
    }
}
