//! The field contract: for every field of the recipe schema, what carries it out and which
//! values `recipe check` refuses because nothing can honour them yet.
//!
//! A recipe is a promise. A field that passes the check and then changes nothing is a silent
//! wrong result, so every field is in [`fields`] with the part of the node that does what it
//! says and the name of a test that fails if it stopped doing so, or with the values the check
//! refuses (and what works today). The schema walk ([`schema`]) reads [`MAXIMAL`] through the
//! recipe's own deserializer and records every field it meets with the shape it was read as;
//! the tests in `contract/tests.rs` hold the two together: a field added to the schema without
//! an entry here, an entry naming a test that does not exist, or a refusal the check does not
//! make, fails CI. `docs/recipes.md`'s field table is [`markdown`]'s output, checked the same
//! way; `mindxtrain recipe fields` prints it.

mod fields;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use super::de::{PathStack, Shape, Sink};
use super::error::{FieldPath, Seg};
use super::{Recipe, yaml};
use serde::Deserialize;

pub use fields::fields;

/// A recipe that writes every field of the schema once (its method a placeholder that
/// [`schema`] fills with each `kind` in turn).
pub const MAXIMAL: &str = include_str!("contract/maximal.yaml");

/// One method of each `kind`, every field written, in [`MAXIMAL`]'s flow style.
const METHODS: &[&str] = &[
    "{kind: full}",
    "{kind: cpt}",
    "{kind: lora, r: 8, alpha: 16, dropout: 0.0, target_modules: [q_proj], rslora: false}",
    "{kind: qlora, r: 8, alpha: 16, dropout: 0.0, target_modules: [q_proj], rslora: false, bits: 4}",
    "{kind: dpo, beta: 0.1, loss: sigmoid, label_smoothing: 0.0, lora: LORA}",
    "{kind: orpo, beta: 0.1, lora: LORA}",
    "{kind: kto, beta: 0.1, desirable_weight: 1.0, undesirable_weight: 1.0, lora: LORA}",
    "{kind: grpo, num_generations: 2, kl_coef: 0.0, clip_epsilon: 0.2, max_new_tokens: 8, temperature: 1.0, \
     rewards: [format], lora: LORA}",
    "{kind: gspo, num_generations: 2, kl_coef: 0.0, clip_epsilon: 0.2, max_new_tokens: 8, temperature: 1.0, \
     rewards: [format], lora: LORA}",
];
const LORA: &str = "{r: 8, alpha: 16, dropout: 0.0, target_modules: [q_proj], rslora: false}";

/// What the node does with one field. Each field is carried out, proven by `differs` or
/// `test`; or refused in every value but its default (`refused`); or configures a step whose
/// switch is refused (`inert_unless`).
#[derive(Debug, Clone, Copy)]
pub struct Field {
    /// Dotted path; a method's fields carry their kind (`train.method[qlora].bits`).
    pub path: &'static str,
    /// What carries the field out, for the reference table.
    pub does: &'static str,
    /// A `#[test]` of this workspace that fails if the field were accepted and ignored.
    pub test: &'static str,
    /// Two JSON merge patches on the training base of `contract/tests.rs`: the run with
    /// both applied must end differently (weights, events, files) from the run with the first.
    pub differs: Option<(&'static str, &'static str)>,
    /// Values the check refuses because nothing honours them yet.
    pub refused: &'static [Refusal],
    /// The switch (a field refused when on) without which this field does nothing.
    pub inert_unless: Option<&'static str>,
}

/// A value `recipe check` refuses: a JSON merge patch (RFC 7386) on [`base_recipe`] that
/// sets it, and words its error must contain.
#[derive(Debug, Clone, Copy)]
pub struct Refusal {
    pub patch: &'static str,
    /// What the value is, for the table (`fp8`, `8`, `> 1`).
    pub value: &'static str,
    pub says: &'static str,
}

/// The fields the schema has, each with what it was read as (`"integer"`, `` "`a` | `b`" ``),
/// from reading [`MAXIMAL`] once per method kind.
pub fn schema() -> BTreeMap<String, String> {
    let mut shapes = BTreeMap::new();
    let mut items = BTreeMap::new();
    for (kind, path, shape) in walk() {
        match list_of(&path) {
            Some(list) => {
                items.entry(schema_name(&list, kind)).or_insert(shape);
            }
            None => {
                shapes.entry(schema_name(&path, kind)).or_insert(shape);
            }
        }
    }
    shapes
        .into_iter()
        .filter_map(|(name, shape)| {
            let name = name?;
            let text = match (shape, items.get(&Some(name.clone()))) {
                (Shape::List, Some(item)) => format!("list of {}", describe(*item)),
                (shape, _) => describe(shape),
            };
            Some((name, text))
        })
        .collect()
}

/// The fields every section declares (read or not), as [`schema`] names them: what
/// [`MAXIMAL`] must write for the walk to be whole.
#[cfg(test)]
pub(crate) fn declared() -> Vec<String> {
    let mut out: Vec<String> = walk()
        .into_iter()
        .flat_map(|(kind, path, shape)| match shape {
            Shape::Section(fields) => fields.iter().filter_map(|f| schema_name(&path.clone().key(f), kind)).collect(),
            _ => Vec::new(),
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Every field read in [`MAXIMAL`] with each method kind, and its shape.
fn walk() -> Vec<(&'static str, FieldPath, Shape)> {
    let mut out = Vec::new();
    for method in METHODS {
        let kind = method.trim_start_matches("{kind: ").split([',', '}']).next().unwrap_or_default();
        let src = MAXIMAL.replace("METHOD", &method.replace("LORA", LORA));
        out.extend(read_shapes(&src).into_iter().map(|(path, shape)| (kind, path, shape)));
    }
    out
}

/// The list `path` is an item of, if it is one.
fn list_of(path: &FieldPath) -> Option<FieldPath> {
    match path.0.last() {
        Some(Seg::Index(_)) => Some(FieldPath(path.0[..path.0.len() - 1].to_vec())),
        _ => None,
    }
}

fn read_shapes(src: &str) -> Vec<(FieldPath, Shape)> {
    let sink = Sink::recording();
    if let Ok(tree) = yaml::parse(src) {
        let root = PathStack::Root;
        let _ = Recipe::deserialize(super::de::De::root(&tree, &root, &sink));
    }
    sink.shapes.take().unwrap_or_default()
}

/// The contract's name for a path read in a recipe whose method is `kind`: `None` for the
/// document root, list items and a free mapping's keys (their list or mapping is the field).
fn schema_name(path: &FieldPath, kind: &str) -> Option<String> {
    let mut keys = Vec::new();
    for seg in &path.0 {
        match seg {
            Seg::Key(k) => keys.push(k.as_str()),
            Seg::Index(_) => return None,
        }
    }
    let free_maps = ["train.env", "data.columns"];
    let dotted = keys.join(".");
    if dotted.is_empty() || free_maps.iter().any(|m| dotted.starts_with(&format!("{m}."))) {
        return None;
    }
    // A method's fields are its kind's; the `kind` tag itself is one field for all of them.
    Some(match dotted.strip_prefix("train.method") {
        Some(".kind") => dotted,
        Some(rest) => format!("train.method[{kind}]{rest}"),
        None => dotted,
    })
}

fn describe(shape: Shape) -> String {
    let values = |v: &[&str]| v.iter().map(|v| format!("`{v}`")).collect::<Vec<_>>().join(" \\| ");
    match shape {
        Shape::Bool => "bool".into(),
        Shape::Int => "integer".into(),
        Shape::Number => "number".into(),
        Shape::Text => "text".into(),
        Shape::List => "list".into(),
        Shape::Map => "mapping".into(),
        Shape::Section(_) => "section".into(),
        Shape::OneOf(v) => values(v),
        Shape::Tagged(v) => format!("mapping with `kind`: {}", values(v)),
    }
}

/// The recipe refusals are tried on: `recipes/tiny_cpu_lora.yaml` resolved, as JSON.
pub fn base_recipe() -> serde_json::Value {
    let src = include_str!("../../../recipes/tiny_cpu_lora.yaml");
    match Recipe::from_str(src, "tiny_cpu_lora.yaml") {
        Ok(loaded) => serde_json::to_value(&loaded.recipe).unwrap_or_default(),
        Err(e) => serde_json::json!({"unreadable": e.to_string()}),
    }
}

/// RFC 7386: `patch`'s members replace `target`'s, `null` removes one, objects merge.
pub fn merge_patch(target: &mut serde_json::Value, patch: &serde_json::Value) {
    let serde_json::Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = serde_json::json!({});
    }
    let serde_json::Value::Object(t) = target else { return };
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(serde_json::Value::Null), v);
        }
    }
}

/// The field table of docs/recipes.md: every field, its type, what carries it out and what
/// the check refuses.
pub fn markdown() -> String {
    let types = schema();
    let mut out =
        String::from("| field | type | carried out by | refused at check time |\n| --- | --- | --- | --- |\n");
    for f in fields() {
        let ty = types.get(f.path).map_or("?", String::as_str);
        let refused = f.refused.iter().map(|r| format!("{}: {}", r.value, r.says)).collect::<Vec<_>>().join("; ");
        let refused = if refused.is_empty() { "—".to_owned() } else { refused.replace('|', "\\|") };
        let does = match (f.does, f.inert_unless) {
            ("", _) => "nothing yet".to_owned(),
            (does, Some(switch)) => format!("{does}, when `{switch}` is (refused today)"),
            (does, None) => does.to_owned(),
        };
        out.push_str(&format!("| `{}` | {} | {} | {} |\n", f.path, ty, does.replace('|', "\\|"), refused));
    }
    out
}
