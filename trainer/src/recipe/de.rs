//! A serde `Deserializer` over the located YAML tree.
//!
//! Every error leaves here carrying the line:col and field path of the node it was raised
//! for, so unknown fields, wrong types, missing fields and unknown enum values all point at
//! the file. Enums whose Deserialize passes [`KIND_TAGGED`] as their name are read from a
//! mapping whose `kind` key names the variant; this replaces serde's internally tagged enums,
//! which buffer their input and would lose every location below the tag.
//!
//! One pass finds every error it can go on after ([`Sink`]): an unknown field is noted and
//! skipped, and a value of the wrong type or an unknown enum value is noted and read as a
//! stand-in of the right type, so the rest of the document is still checked. Only what serde's
//! derived code raises itself (a missing field, a value a hand-written `Deserialize` refuses,
//! a section of the wrong shape) ends the pass; [`super::Recipe::check_str`] then drops that
//! field and reads the tree again, a bounded number of times.

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IntoDeserializer, Visitor};

use super::error::{FieldPath, Location};
use super::yaml::{Entry, Mapping, Node, NodeKind, Resolved, resolve};

mod enums;

use enums::{TaggedEnum, UnitEnum};

/// Errors kept with their text; beyond this many only a count is kept, so a document of
/// 80,000 unknown keys costs 80,000 hash lookups, not 80,000 messages.
pub(crate) const MAX_KEPT_ERRORS: usize = 100;

/// Where the deserializer notes the errors it goes on after, across passes.
#[derive(Default)]
pub(crate) struct Sink {
    kept: RefCell<Vec<(Location, FieldPath, String)>>,
    found: Cell<usize>,
    /// Paths with an error: what goes wrong under them is a consequence, not news.
    failed: RefCell<HashSet<FieldPath>>,
    /// Every proper prefix of a failed path.
    above_failed: RefCell<HashSet<FieldPath>>,
    /// Nodes and entries visited, over all passes: what the linearity test bounds.
    pub(crate) work: Cell<u64>,
    /// When set, every field read and the shape it was read as (the field contract's schema
    /// walk, `super::contract`); unset (as in every check) it costs one branch per node.
    pub(crate) shapes: RefCell<Option<Vec<(FieldPath, Shape)>>>,
}

/// What a field was read as: the schema's own account of itself, collected by
/// [`Sink::recording`] for the field contract (`super::contract`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    Bool,
    Int,
    Number,
    Text,
    List,
    /// A mapping of free keys (`train.env`).
    Map,
    /// A mapping of these fields.
    Section(&'static [&'static str]),
    /// A scalar naming one of these values.
    OneOf(&'static [&'static str]),
    /// A mapping whose `kind` names one of these variants.
    Tagged(&'static [&'static str]),
}

impl Sink {
    fn step(&self) {
        self.work.set(self.work.get() + 1);
    }

    /// A sink that also records the shape of every field read.
    pub(crate) fn recording() -> Sink {
        Sink { shapes: RefCell::new(Some(Vec::new())), ..Sink::default() }
    }

    fn shape(&self, path: &PathStack<'_>, shape: Shape) {
        if let Some(shapes) = self.shapes.borrow_mut().as_mut() {
            shapes.push((path.to_path(), shape));
        }
    }

    /// True when `path` or a field around it already has an error.
    pub(crate) fn under_failure(&self, path: &FieldPath) -> bool {
        let failed = self.failed.borrow();
        (0..=path.0.len()).any(|n| failed.contains(&FieldPath(path.0[..n].to_vec())))
    }

    /// True when a field inside `path` (or `path` itself) has an error.
    pub(crate) fn holds_failure(&self, path: &FieldPath) -> bool {
        self.failed.borrow().contains(path) || self.above_failed.borrow().contains(path)
    }

    /// Notes an error at `path` unless it is a consequence of one already noted; returns
    /// whether it was new.
    pub(crate) fn note(&self, loc: Location, path: FieldPath, message: impl FnOnce() -> String) -> bool {
        if self.under_failure(&path) {
            return false;
        }
        self.found.set(self.found.get() + 1);
        let mut kept = self.kept.borrow_mut();
        if kept.len() < MAX_KEPT_ERRORS {
            kept.push((loc, path.clone(), message()));
        }
        let mut above = self.above_failed.borrow_mut();
        for n in 0..path.0.len() {
            above.insert(FieldPath(path.0[..n].to_vec()));
        }
        self.failed.borrow_mut().insert(path);
        true
    }

    /// Notes an unknown key. Its entry is set aside at once, so nothing under it is read and
    /// no later read meets it: it needs no place among the failed paths, and the path and
    /// message are only made for the errors kept (80,000 of them cost 80,000 increments).
    pub(crate) fn note_unknown(
        &self,
        loc: Location,
        path: impl FnOnce() -> FieldPath,
        message: impl FnOnce() -> String,
    ) {
        self.found.set(self.found.get() + 1);
        let mut kept = self.kept.borrow_mut();
        if kept.len() < MAX_KEPT_ERRORS {
            kept.push((loc, path(), message()));
        }
    }

    /// Notes a located error (one that ended a pass, or that a reader went on after).
    pub(crate) fn note_error(&self, e: DeError, root: Location) -> bool {
        let (loc, path) = e.at.unwrap_or((root, FieldPath::default()));
        self.note(loc, path, || e.message)
    }

    /// How many errors were found (kept or only counted).
    pub(crate) fn found(&self) -> usize {
        self.found.get()
    }

    /// The kept errors, in the order found.
    pub(crate) fn take_kept(&self) -> Vec<(Location, FieldPath, String)> {
        std::mem::take(&mut *self.kept.borrow_mut())
    }
}

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
    sink: &'a Sink,
}

impl<'a> De<'a> {
    pub(crate) fn root(node: &'a Node, path: &'a PathStack<'a>, sink: &'a Sink) -> Self {
        De::new(node, node.loc, path, sink)
    }

    fn new(node: &'a Node, loc: Location, path: &'a PathStack<'a>, sink: &'a Sink) -> Self {
        sink.step();
        De { node, loc, path, skip_tag: false, sink }
    }

    /// The same node with the tag key hidden (a variant's fields).
    fn untagged(&self) -> De<'a> {
        De { skip_tag: true, ..De::new(self.node, self.loc, self.path, self.sink) }
    }

    /// Notes `e` here and goes on: the caller reads a stand-in value instead.
    fn tolerate(&self, e: DeError) {
        let e = e.located(self.loc, self.path);
        self.sink.note_error(e, self.loc);
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

    fn mapping(&self) -> Option<&'a Mapping> {
        self.node.mapping()
    }
}

macro_rules! int_method {
    ($method:ident, $ty:ty, $visit:ident, $wide:ty) => {
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
            self.sink.shape(self.path, Shape::Int);
            let (lo, hi) = (<$ty>::MIN as i128, <$ty>::MAX as i128);
            let i = self.int(lo, hi).unwrap_or_else(|e| {
                self.tolerate(e);
                0i128.clamp(lo, hi)
            });
            // The range check above makes the narrowing exact.
            let r = visitor.$visit(i as $wide);
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
        self.sink.shape(self.path, Shape::Bool);
        let b = match self.resolved() {
            Some(Resolved::Bool(b)) => b,
            _ => {
                self.tolerate(self.expected("a boolean (true or false)"));
                false
            }
        };
        let r = visitor.visit_bool(b);
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
        self.sink.shape(self.path, Shape::Number);
        let x = match self.resolved() {
            Some(Resolved::Float(x)) => x,
            // Integers are exact in f64 up to 2^53, far beyond any recipe number.
            Some(Resolved::Int(i)) => i as f64,
            _ => {
                self.tolerate(self.expected("a number"));
                0.0
            }
        };
        let r = visitor.visit_f64(x);
        self.finish(r)
    }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.sink.shape(self.path, Shape::Text);
        let text = match (self.resolved(), &self.node.kind) {
            (Some(Resolved::Str(s)), _) => s,
            // A plain `1` or `true` is not text under YAML 1.2; say how to make it text.
            (Some(r), NodeKind::Scalar { text, .. }) if r != Resolved::Null => {
                let describe = self.describe();
                self.tolerate(
                    self.err(format!("expected a string, found {describe}; quote it (\"{text}\") if text is meant")),
                );
                ""
            }
            _ => {
                self.tolerate(self.expected("a string"));
                ""
            }
        };
        let r = visitor.visit_str(text);
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
        if self.resolved() != Some(Resolved::Null) {
            self.tolerate(self.expected("an empty value"));
        }
        let r = visitor.visit_unit();
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
        self.sink.shape(self.path, Shape::List);
        let items: &[Node] = match &self.node.kind {
            NodeKind::Seq(items) => items,
            _ => {
                self.tolerate(self.expected("a list"));
                &[]
            }
        };
        let r = visitor.visit_seq(SeqAcc { items, next: 0, path: self.path, sink: self.sink });
        self.finish(r)
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, DeError> {
        self.sink.shape(self.path, Shape::List);
        let r = match &self.node.kind {
            NodeKind::Seq(items) if items.len() == len => {
                visitor.visit_seq(SeqAcc { items, next: 0, path: self.path, sink: self.sink })
            }
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
        self.sink.shape(self.path, Shape::Map);
        let r = match self.mapping() {
            Some(map) => visitor.visit_map(MapAcc::new(map, &self, None)),
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
        self.sink.shape(self.path, Shape::Section(fields));
        let r = match self.mapping() {
            Some(map) => visitor.visit_map(MapAcc::new(map, &self, Some(fields))),
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
        let tagged = name == KIND_TAGGED;
        self.sink.shape(self.path, if tagged { Shape::Tagged(variants) } else { Shape::OneOf(variants) });
        let r = match (&self.node.kind, tagged) {
            (NodeKind::Scalar { text, .. }, false) => {
                // An unknown value is noted and read as the first variant, to go on.
                let known = variants.contains(&text.as_str()) || variants.is_empty();
                if !known {
                    self.tolerate(de::Error::unknown_variant(text, variants));
                }
                let name = if known { text.as_str() } else { variants[0] };
                visitor.visit_enum(UnitEnum { de: &self, name })
            }
            (NodeKind::Map(map), true) => match map.get(TAG_KEY) {
                Some(tag) => visitor.visit_enum(TaggedEnum { de: &self, tag, variants }),
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
    sink: &'a Sink,
}

impl<'de> de::SeqAccess<'de> for SeqAcc<'_> {
    type Error = DeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, DeError> {
        let Some(node) = self.items.get(self.next) else {
            return Ok(None);
        };
        let path = PathStack::Index(self.path, self.next);
        self.next += 1;
        seed.deserialize(De::new(node, node.loc, &path, self.sink)).map(Some).map_err(|e| e.located(node.loc, &path))
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
    /// A struct's fields: any other key is noted as unknown and skipped.
    fields: Option<&'static [&'static str]>,
    sink: &'a Sink,
}

impl<'a> MapAcc<'a> {
    fn new(map: &'a Mapping, de: &De<'a>, fields: Option<&'static [&'static str]>) -> Self {
        MapAcc {
            entries: map.entries().iter(),
            current: None,
            path: de.path,
            skip_tag: de.skip_tag,
            fields,
            sink: de.sink,
        }
    }

    /// Notes an unknown key and sets its entry aside, so a later pass skips it at once.
    fn unknown(&self, entry: &Entry, fields: &'static [&'static str]) {
        let path = || PathStack::Key(self.path, &entry.key).to_path();
        let message = || <DeError as de::Error>::unknown_field(&entry.key, fields).message;
        self.sink.note_unknown(entry.key_loc, path, message);
        entry.dropped.set(true);
    }
}

impl<'de> de::MapAccess<'de> for MapAcc<'_> {
    type Error = DeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, DeError> {
        let entry = loop {
            let Some(e) = self.entries.next() else { return Ok(None) };
            self.sink.step();
            if !e.live() || (self.skip_tag && &*e.key == TAG_KEY) {
                continue;
            }
            match self.fields {
                Some(fields) if !fields.contains(&&*e.key) => self.unknown(e, fields),
                _ => break e,
            }
        };
        self.current = Some(entry);
        let path = PathStack::Key(self.path, &entry.key);
        let key: de::value::StrDeserializer<'_, DeError> = (&*entry.key).into_deserializer();
        seed.deserialize(key).map(Some).map_err(|e| e.located(entry.key_loc, &path))
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        let Some(entry) = self.current.take() else {
            return Err(de::Error::custom("value requested before its key"));
        };
        let path = PathStack::Key(self.path, &entry.key);
        // Errors a Deserialize impl raises after reading its value (a bad amount, a refused
        // policy) have not met a node yet; this is the field they belong to.
        seed.deserialize(De::new(&entry.value, entry.key_loc, &path, self.sink))
            .map_err(|e| e.located(entry.key_loc, &path))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.entries.len())
    }
}
