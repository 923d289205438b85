//! YAML text to a small tree of located nodes.
//!
//! saphyr-parser gives events with spans; this module folds them into a tree and refuses,
//! with a location, what recipes do not allow: duplicate keys, anchors and aliases (so no
//! alias expansion can blow up), tags, non-string keys, several documents, deep nesting.
//!
//! Every step is linear in the text: a mapping finds a key through a hash index (a
//! mapping of 80,000 keys once took 25 s to check for duplicates pairwise), and the
//! deserializer's error recovery drops an entry by marking it, not by rebuilding the tree.

use std::cell::Cell;
use std::collections::HashMap;
use std::rc::Rc;

use saphyr_parser::{Event, Parser, ScalarStyle, Span};

use super::error::{FieldPath, Location, Seg};

/// Recipes are a few levels deep; the cap keeps recursion in the deserializer bounded.
pub(crate) const MAX_DEPTH: usize = 32;

/// Most nodes (keys, values, lists and mappings) a recipe may hold. The recipes in
/// `recipes/` hold at most about 200; a file with more is generated or hostile, and the cap bounds
/// the work one check does: YAML parsing costs ~400 instructions per byte of small nodes,
/// so a megabyte of them would take most of the 100 ms a check may use.
pub const MAX_NODES: usize = 10_000;

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    pub loc: Location,
    pub kind: NodeKind,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum NodeKind {
    Scalar { text: String, plain: bool },
    Seq(Vec<Node>),
    Map(Box<Mapping>),
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Entry {
    /// Shared with the mapping's index: one allocation per key.
    pub key: Rc<str>,
    pub key_loc: Location,
    pub value: Node,
    /// Set when error recovery has set the entry aside: readers skip it from then on.
    pub dropped: Cell<bool>,
}

impl Entry {
    pub(crate) fn live(&self) -> bool {
        !self.dropped.get()
    }
}

/// A mapping's entries in file order, with each key's position for lookups in O(1).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Mapping {
    entries: Vec<Entry>,
    index: HashMap<Rc<str>, usize>,
}

impl Mapping {
    /// Every entry in file order, dropped ones included (check [`Entry::live`]).
    pub(crate) fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The live entry with this key.
    pub(crate) fn get(&self, key: &str) -> Option<&Entry> {
        self.index.get(key).map(|&i| &self.entries[i]).filter(|e| e.live())
    }

    /// Reserves `key` for the next entry pushed (one hash per key); returns the first
    /// one's location when the key is already there.
    fn claim(&mut self, key: Rc<str>) -> Result<(), Location> {
        match self.index.entry(key) {
            std::collections::hash_map::Entry::Occupied(first) => Err(self.entries[*first.get()].key_loc),
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(self.entries.len());
                Ok(())
            }
        }
    }
}

/// What a scalar means under the YAML 1.2 core schema.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Resolved<'a> {
    Null,
    Bool(bool),
    Int(i128),
    /// Looks like an integer but does not fit in 128 bits.
    HugeInt,
    Float(f64),
    Str(&'a str),
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SyntaxError {
    pub loc: Location,
    pub path: FieldPath,
    pub message: String,
}

pub(crate) fn resolve(text: &str, plain: bool) -> Resolved<'_> {
    if !plain {
        return Resolved::Str(text);
    }
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Resolved::Null,
        "true" | "True" | "TRUE" => return Resolved::Bool(true),
        "false" | "False" | "FALSE" => return Resolved::Bool(false),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => {
            return Resolved::Float(f64::INFINITY);
        }
        "-.inf" | "-.Inf" | "-.INF" => return Resolved::Float(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => return Resolved::Float(f64::NAN),
        _ => {}
    }
    let radix = |prefix: &str, radix: u32| {
        let digits = text.strip_prefix(prefix)?;
        let ok = !digits.is_empty() && digits.chars().all(|c| c.is_digit(radix));
        ok.then(|| i128::from_str_radix(digits, radix).map_or(Resolved::HugeInt, Resolved::Int))
    };
    if let Some(r) = radix("0x", 16).or_else(|| radix("0o", 8)) {
        return r;
    }
    let unsigned = text.strip_prefix(['-', '+']).unwrap_or(text);
    if !unsigned.is_empty() && unsigned.bytes().all(|b| b.is_ascii_digit()) {
        return text.parse::<i128>().map_or(Resolved::HugeInt, Resolved::Int);
    }
    if is_core_float(unsigned)
        && let Ok(f) = text.parse::<f64>()
    {
        return Resolved::Float(f);
    }
    Resolved::Str(text)
}

/// `(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?`, the core schema's float without sign.
fn is_core_float(s: &str) -> bool {
    let (mantissa, exponent) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let digits = |t: &str| t.bytes().all(|b| b.is_ascii_digit());
    let mantissa_ok = match mantissa.split_once('.') {
        Some((int, frac)) => digits(int) && digits(frac) && !(int.is_empty() && frac.is_empty()),
        None => !mantissa.is_empty() && digits(mantissa),
    };
    let exponent_ok = exponent.is_none_or(|e| {
        let e = e.strip_prefix(['-', '+']).unwrap_or(e);
        !e.is_empty() && digits(e)
    });
    mantissa_ok && exponent_ok && (s.contains('.') || exponent.is_some())
}

fn loc_of(span: &Span) -> Location {
    Location { line: span.start.line().max(1), column: span.start.col() + 1 }
}

enum Frame {
    Seq { loc: Location, items: Vec<Node> },
    Map { loc: Location, map: Mapping, key: Option<(Rc<str>, Location)> },
}

struct Builder {
    stack: Vec<Frame>,
    root: Option<Node>,
}

impl Builder {
    /// The path of the node being built, for errors raised before it is complete.
    fn path(&self) -> FieldPath {
        let mut path = FieldPath::default();
        for frame in &self.stack {
            match frame {
                Frame::Seq { items, .. } => path = path.index(items.len()),
                Frame::Map { key: Some((k, _)), .. } => path = path.key(k),
                Frame::Map { key: None, .. } => {}
            }
        }
        path
    }

    fn fail(&self, loc: Location, message: impl Into<String>) -> SyntaxError {
        SyntaxError { loc, path: self.path(), message: message.into() }
    }

    fn in_key_position(&self) -> bool {
        matches!(self.stack.last(), Some(Frame::Map { key: None, .. }))
    }

    fn open(&mut self, frame: Frame, loc: Location) -> Result<(), SyntaxError> {
        if self.in_key_position() {
            return Err(self.fail(loc, "mapping keys must be plain strings, not lists or mappings"));
        }
        if self.stack.len() >= MAX_DEPTH {
            return Err(self.fail(loc, format!("nesting deeper than {MAX_DEPTH} levels")));
        }
        self.stack.push(frame);
        Ok(())
    }

    fn close(&mut self) -> Result<(), SyntaxError> {
        let node = match self.stack.pop() {
            Some(Frame::Seq { loc, items }) => Node { loc, kind: NodeKind::Seq(items) },
            Some(Frame::Map { loc, map, .. }) => Node { loc, kind: NodeKind::Map(Box::new(map)) },
            None => return Ok(()),
        };
        self.attach(node)
    }

    fn scalar(&mut self, text: String, plain: bool, loc: Location) -> Result<(), SyntaxError> {
        if self.in_key_position() {
            let text: Rc<str> = text.into();
            let claimed = match self.stack.last_mut() {
                Some(Frame::Map { map, .. }) => map.claim(text.clone()),
                _ => Ok(()),
            };
            if let Err(first) = claimed {
                let mut err = self.fail(loc, format!("duplicate key (first defined at line {})", first.line));
                err.path = err.path.key(&text);
                return Err(err);
            }
            if let Some(Frame::Map { key, .. }) = self.stack.last_mut() {
                *key = Some((text, loc));
            }
            return Ok(());
        }
        self.attach(Node { loc, kind: NodeKind::Scalar { text, plain } })
    }

    fn attach(&mut self, node: Node) -> Result<(), SyntaxError> {
        match self.stack.last_mut() {
            Some(Frame::Seq { items, .. }) => items.push(node),
            Some(Frame::Map { map, key, .. }) => {
                // The key claimed its place in the index when it was read; its value is the
                // next entry.
                if let Some((key, key_loc)) = key.take() {
                    map.entries.push(Entry { key, key_loc, value: node, dropped: Cell::new(false) });
                }
            }
            None => self.root = Some(node),
        }
        Ok(())
    }
}

/// Where the text ends, counting line breaks as YAML does (`\n`, `\r\n`, lone `\r`).
fn end_of(src: &str) -> Location {
    let (mut line, mut column, mut chars) = (1, 1, src.chars().peekable());
    while let Some(c) = chars.next() {
        if c == '\n' || (c == '\r' && chars.peek() != Some(&'\n')) {
            (line, column) = (line + 1, 1);
        } else if c != '\r' {
            column += 1;
        }
    }
    Location { line, column }
}

/// Parses one YAML document into a located tree.
pub(crate) fn parse(src: &str) -> Result<Node, SyntaxError> {
    let mut parser = Parser::new_from_str(src);
    let mut b = Builder { stack: Vec::new(), root: None };
    let (mut documents, mut nodes) = (0usize, 0usize);
    // The scanner may place an unexpected end, or an implicit empty value, one line past the
    // text; clamping keeps every location inside the file.
    let end = end_of(src);
    while let Some(next) = parser.next_event() {
        let (event, span) = next.map_err(|e| {
            let loc = Location { line: e.marker().line().max(1), column: e.marker().col() + 1 };
            let loc = loc.min(end);
            b.fail(loc, format!("invalid YAML: {}", e.info()))
        })?;
        let loc = loc_of(&span).min(end);
        if matches!(event, Event::Scalar(..) | Event::SequenceStart(..) | Event::MappingStart(..)) {
            nodes += 1;
            if nodes > MAX_NODES {
                return Err(b.fail(
                    loc,
                    format!(
                        "more than {MAX_NODES} keys and values: recipes are written by hand and hold a few hundred; \
                         checking stops here"
                    ),
                ));
            }
        }
        let anchored = |id: usize| id != 0;
        match event {
            Event::DocumentStart(_) => {
                documents += 1;
                if documents > 1 {
                    return Err(b.fail(loc, "a recipe holds exactly one YAML document; found a second `---`"));
                }
            }
            Event::Alias(_) => {
                return Err(b.fail(loc, "YAML aliases (*name) are not supported in recipes; write the value out"));
            }
            Event::Scalar(_, _, id, _) | Event::SequenceStart(id, _) | Event::MappingStart(id, _) if anchored(id) => {
                return Err(b.fail(loc, "YAML anchors (&name) are not supported in recipes; write the value out"));
            }
            Event::Scalar(_, _, _, Some(tag))
            | Event::SequenceStart(_, Some(tag))
            | Event::MappingStart(_, Some(tag)) => {
                return Err(
                    b.fail(loc, format!("YAML tags ({tag}) are not supported in recipes; quote the value instead"))
                );
            }
            Event::Scalar(text, style, _, None) => {
                b.scalar(text.into_owned(), style == ScalarStyle::Plain, loc)?;
            }
            Event::SequenceStart(_, None) => b.open(Frame::Seq { loc, items: Vec::new() }, loc)?,
            Event::MappingStart(_, None) => {
                b.open(Frame::Map { loc, map: Mapping::default(), key: None }, loc)?;
            }
            Event::SequenceEnd | Event::MappingEnd => b.close()?,
            Event::StreamStart | Event::StreamEnd | Event::DocumentEnd | Event::Nothing => {}
        }
    }
    b.root.ok_or_else(|| SyntaxError {
        loc: Location::START,
        path: FieldPath::default(),
        message: "empty recipe: expected a mapping with sections meta, hardware, model, data, train".into(),
    })
}

impl Node {
    pub(crate) fn mapping(&self) -> Option<&Mapping> {
        match &self.kind {
            NodeKind::Map(m) => Some(m),
            _ => None,
        }
    }

    /// The child at one step of a path, if it is there and live.
    fn child(&self, seg: &Seg) -> Option<(Location, &Node)> {
        match (seg, &self.kind) {
            (Seg::Key(k), NodeKind::Map(map)) => map.get(k).map(|e| (e.key_loc, &e.value)),
            (Seg::Index(i), NodeKind::Seq(items)) => items.get(*i).map(|n| (n.loc, n)),
            _ => None,
        }
    }

    /// Where the field at `path` is written (its key), or where its nearest written ancestor
    /// is when the field itself was left to its default.
    pub(crate) fn locate(&self, path: &FieldPath) -> Location {
        let mut node = self;
        let mut loc = self.loc;
        for seg in &path.0 {
            match node.child(seg) {
                Some((l, n)) => {
                    loc = l;
                    node = n;
                }
                None => break,
            }
        }
        loc
    }

    /// Sets the mapping entry at `path` (which must end in a key) aside; false if absent.
    pub(crate) fn drop_entry(&self, path: &FieldPath) -> bool {
        let Some((Seg::Key(last), parents)) = path.0.split_last() else {
            return false;
        };
        let mut node = self;
        for seg in parents {
            match node.child(seg) {
                Some((_, n)) => node = n,
                None => return false,
            }
        }
        match node.mapping().and_then(|m| m.get(last)) {
            Some(entry) => {
                entry.dropped.set(true);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_schema_resolution() {
        assert_eq!(resolve("12", true), Resolved::Int(12));
        assert_eq!(resolve("-3", true), Resolved::Int(-3));
        assert_eq!(resolve("0x1f", true), Resolved::Int(31));
        assert_eq!(resolve("1.5", true), Resolved::Float(1.5));
        assert_eq!(resolve("5e-7", true), Resolved::Float(5e-7));
        assert_eq!(resolve("1.0e-4", true), Resolved::Float(1e-4));
        assert_eq!(resolve("12", false), Resolved::Str("12"));
        assert_eq!(resolve("yes", true), Resolved::Str("yes"));
        assert_eq!(resolve("", true), Resolved::Null);
        assert_eq!(resolve("1e", true), Resolved::Str("1e"));
        assert_eq!(resolve(".", true), Resolved::Str("."));
        assert_eq!(resolve("99999999999999999999999999999999999999999", true), Resolved::HugeInt);
    }

    #[test]
    fn duplicate_key_is_located() {
        let err = parse("a:\n  b: 1\n  b: 2\n").unwrap_err();
        assert_eq!((err.loc.line, err.loc.column), (3, 3));
        assert_eq!(err.path.to_string(), "a.b");
    }

    #[test]
    fn aliases_and_extra_documents_are_refused() {
        assert!(parse("a: &x 1\nb: *x\n").unwrap_err().message.contains("anchors"));
        assert!(parse("a: 1\n---\nb: 2\n").unwrap_err().message.contains("one YAML document"));
        assert!(parse("a: !!str 1\n").unwrap_err().message.contains("tags"));
    }

    #[test]
    fn deep_nesting_is_refused() {
        let src = "[".repeat(MAX_DEPTH + 5);
        assert!(parse(&src).unwrap_err().message.contains("nesting"));
    }
}
