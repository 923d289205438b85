//! Errors a recipe can produce, and the field paths and locations they carry.

use std::fmt;

/// A position in a recipe file: 1-based line and 1-based column (in characters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Location {
    pub line: usize,
    pub column: usize,
}

impl Location {
    pub(crate) const START: Location = Location { line: 1, column: 1 };
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// One step of a field path: a mapping key or a list index.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Seg {
    Key(String),
    Index(usize),
}

/// A field path such as `train.method.target_modules[2]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct FieldPath(pub(crate) Vec<Seg>);

impl FieldPath {
    /// Builds a path of keys from a dotted string; validation code names fields this way.
    pub(crate) fn keys(dotted: &str) -> FieldPath {
        FieldPath(dotted.split('.').filter(|s| !s.is_empty()).map(|s| Seg::Key(s.to_owned())).collect())
    }

    pub(crate) fn key(mut self, key: &str) -> FieldPath {
        self.0.push(Seg::Key(key.to_owned()));
        self
    }

    pub(crate) fn index(mut self, index: usize) -> FieldPath {
        self.0.push(Seg::Index(index));
        self
    }

    /// The path up to and including its last key: a list item is dropped together with the
    /// list, since removing one item would shift the indices that later errors name.
    pub(crate) fn up_to_last_key(&self) -> FieldPath {
        let end = self.0.iter().rposition(|s| matches!(s, Seg::Key(_))).map_or(0, |i| i + 1);
        FieldPath(self.0[..end].to_vec())
    }

    pub(crate) fn parent(&self) -> FieldPath {
        let mut segs = self.0.clone();
        segs.pop();
        FieldPath(segs)
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("(root)");
        }
        for (i, seg) in self.0.iter().enumerate() {
            match seg {
                Seg::Key(k) => {
                    if i > 0 {
                        f.write_str(".")?;
                    }
                    // Quoted when the key itself would make the path ambiguous or invisible.
                    let plain = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
                    if k.is_empty() || !k.chars().all(plain) {
                        write!(f, "{k:?}")?;
                    } else {
                        f.write_str(k)?;
                    }
                }
                Seg::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

/// What went wrong, broadly; the message says exactly what.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The file could not be read, is too large, or is not UTF-8.
    Io,
    /// Not well-formed YAML, or YAML features recipes refuse (anchors, tags, several documents).
    Syntax,
    /// Does not fit the schema: unknown or missing field, wrong type, unknown value.
    Schema,
    /// Fits the schema but breaks a rule: a range, a hardware invariant, a cross-field rule.
    Invariant,
}

/// One problem in a recipe.
///
/// Displays as `file:line:col path: message`, e.g.
/// `recipes/x.yaml:14:5 train.method.r: expected integer 1..=512, found 600`.
/// The path of the document root is written `(root)`. Only an [`ErrorKind::Io`] error lacks a
/// location; it displays as `file: message`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct RecipeError {
    source_name: String,
    location: Option<Location>,
    path: String,
    message: String,
    kind: ErrorKind,
}

impl RecipeError {
    pub(crate) fn new(
        source_name: &str,
        location: Location,
        path: &FieldPath,
        message: String,
        kind: ErrorKind,
    ) -> Self {
        RecipeError {
            source_name: source_name.to_owned(),
            location: Some(location),
            path: path.to_string(),
            message,
            kind,
        }
    }

    pub(crate) fn io(source_name: &str, message: String) -> Self {
        RecipeError {
            source_name: source_name.to_owned(),
            location: None,
            path: String::new(),
            message,
            kind: ErrorKind::Io,
        }
    }

    /// The file name (or origin name given to [`crate::recipe::Recipe::from_str`]).
    pub fn source_name(&self) -> &str {
        &self.source_name
    }

    /// Line and column; `None` only for [`ErrorKind::Io`].
    pub fn location(&self) -> Option<Location> {
        self.location
    }

    /// The dotted field path, e.g. `train.method.r` or `train.env.NCCL_MIN_NCHANNELS`.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The message alone, without file, location or path.
    pub fn message(&self) -> &str {
        &self.message
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
}

impl fmt::Display for RecipeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.location {
            Some(loc) => write!(f, "{}:{} {}: {}", self.source_name, loc, self.path, self.message),
            None => write!(f, "{}: {}", self.source_name, self.message),
        }
    }
}

/// Every problem found in one recipe, in file order; never empty. A recipe with more
/// problems than are worth listing (80,000 unknown keys, say) keeps the first ones found and
/// counts the rest ([`RecipeErrors::omitted`]).
///
/// Displays one [`RecipeError`] per line, which is what `recipe check` prints, then a line
/// with the count of those left out, if any.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct RecipeErrors {
    errors: Vec<RecipeError>,
    omitted: usize,
}

impl RecipeErrors {
    /// Sorts by location so a reader can walk the file top to bottom.
    pub(crate) fn new(mut errors: Vec<RecipeError>) -> Option<Self> {
        errors.sort_by_key(|e| e.location);
        (!errors.is_empty()).then_some(RecipeErrors { errors, omitted: 0 })
    }

    pub(crate) fn one(error: RecipeError) -> Self {
        RecipeErrors { errors: vec![error], omitted: 0 }
    }

    pub(crate) fn with_omitted(mut self, omitted: usize) -> Self {
        self.omitted = omitted;
        self
    }

    /// Problems found but not listed (beyond the first 100 of a pass).
    pub fn omitted(&self) -> usize {
        self.omitted
    }

    /// The problem nearest the top of the file.
    pub fn first(&self) -> &RecipeError {
        // The constructor refuses an empty list, so index 0 exists.
        &self.errors[0]
    }

    /// The listed problems.
    pub fn iter(&self) -> std::slice::Iter<'_, RecipeError> {
        self.errors.iter()
    }

    /// How many problems are listed (see also [`RecipeErrors::omitted`]).
    pub fn len(&self) -> usize {
        self.errors.len()
    }

    /// Always false; present because clippy expects it beside `len`.
    pub fn is_empty(&self) -> bool {
        self.errors.is_empty()
    }

    pub fn into_vec(self) -> Vec<RecipeError> {
        self.errors
    }
}

impl From<RecipeErrors> for RecipeError {
    fn from(errors: RecipeErrors) -> Self {
        errors.errors.into_iter().next().unwrap_or_else(|| RecipeError::io("<recipe>", "no error".into()))
    }
}

impl<'a> IntoIterator for &'a RecipeErrors {
    type Item = &'a RecipeError;
    type IntoIter = std::slice::Iter<'a, RecipeError>;
    fn into_iter(self) -> Self::IntoIter {
        self.errors.iter()
    }
}

impl fmt::Display for RecipeErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        if self.omitted > 0 {
            write!(f, "\n{}: … and {} more problems not listed", self.errors[0].source_name, self.omitted)?;
        }
        Ok(())
    }
}

/// Why a plan's environment overrides cannot be applied to a recipe.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EnvOverrideError {
    /// The plan tried to unset a key the hardware requires.
    #[error("plan removes mandatory ROCm env key {key}: a plan may change its value, never drop it")]
    RemovesMandatoryKey { key: String },
    /// The plan set a required key to the empty string, which ROCm reads as unset.
    #[error("plan sets mandatory ROCm env key {key} to an empty value, which ROCm treats as unset")]
    EmptiesMandatoryKey { key: String },
    /// The plan's `PYTORCH_ROCM_ARCH` leaves out the recipe's `hardware.arch`.
    #[error("plan sets PYTORCH_ROCM_ARCH to {value:?}, which leaves out the hardware's arch {arch}")]
    DropsHardwareArch { value: String, arch: String },
    /// The plan named a key that is not a valid environment variable name.
    #[error("plan names an invalid env key {key:?}: expected [A-Z_][A-Z0-9_]*")]
    InvalidKey { key: String },
}
