//! The model card: `README.md` in a run's `final/` (and in `mindxtrain export` output), in the
//! Hugging Face model-card format: YAML front matter (`license`, `base_model`, `library_name`,
//! `tags`, `datasets`, and mindxtrain's own `mindxtrain` mapping), then a body for people.
//!
//! Every front-matter value is written as one line of JSON after its key (keys sorted). JSON is YAML's flow
//! style, so the hub (and `huggingface_hub.ModelCard`) reads it as YAML, and this module reads
//! it back without a YAML parser: `export` carries the run's card by parsing it, marking the
//! weights as merged and rendering it again. The body is rendered from the front matter alone,
//! so the two never disagree. Nothing in the card depends on the clock or the run id: two runs
//! of one recipe, plan and seed write the same card, as they write the same weights.

use super::base::{self, BaseRecord};
use super::eval::EvalReport;
use crate::recipe::{DataSource, Recipe};
use serde_json::{Map, Value, json};
use std::path::Path;
use thiserror::Error;

/// The card's file name, as the hub expects it.
pub const MODEL_CARD_FILE: &str = "README.md";
/// The receipt's place when the recipe's `receipt.output` is unset (in the run directory).
pub const DEFAULT_RECEIPT_FILE: &str = "receipt.json";

const FENCE: &str = "---";
/// mindxtrain's own front-matter key: what the body is rendered from besides the hub's keys.
const OWN_KEY: &str = "mindxtrain";

#[derive(Debug, Error)]
pub enum CardError {
    #[error("{path}: not a mindxtrain model card: {reason}")]
    Foreign { path: String, reason: String },
}

/// What a card says, gathered from the run (or from an exported checkpoint's recipe).
pub struct CardFacts<'a> {
    pub recipe: &'a Recipe,
    pub recipe_dir: &'a Path,
    /// The weights the run started from (`None`: not recorded beside an exported checkpoint).
    pub base: Option<&'a BaseRecord>,
    /// The directory holds a PEFT adapter (else full weights).
    pub adapter: bool,
    /// The run's last evaluation, if it had one.
    pub eval: Option<&'a EvalReport>,
}

/// The card of a run's `final/` directory.
pub fn model_card(facts: &CardFacts) -> String {
    render(&front_matter(facts))
}

/// The card of an export that folded an adapter into its base: the checkpoint's own card
/// (`card`, read from its directory) with `library_name: transformers` and the weights marked
/// merged; a checkpoint without a card (an intermediate step) gets one from `facts`.
pub fn merged_card(card: Option<&str>, facts: &CardFacts, shown: &str) -> Result<String, CardError> {
    let mut map = match card {
        Some(text) => parse(text, shown)?,
        None => front_matter(facts),
    };
    map.insert("library_name".into(), json!("transformers"));
    if let Some(Value::Object(own)) = map.get_mut(OWN_KEY) {
        own.insert("merged".into(), json!(true));
    }
    Ok(render(&map))
}

fn front_matter(f: &CardFacts) -> Map<String, Value> {
    let r = f.recipe;
    let method = serde_json::to_value(r.train.method.kind()).unwrap_or(Value::Null);
    let family = serde_json::to_value(r.model.family).unwrap_or(Value::Null);
    let mut m = Map::new();
    m.insert("license".into(), json!(r.meta.license));
    if let Some(id) = f.base.and_then(|b| base_model(r, f.recipe_dir, b)) {
        m.insert("base_model".into(), json!(id));
    }
    m.insert("library_name".into(), json!(if f.adapter { "peft" } else { "transformers" }));
    m.insert("pipeline_tag".into(), json!("text-generation"));
    m.insert("tags".into(), json!(["mindxtrain", method, family]));
    if r.data.source == DataSource::Hf
        && let Some(id) = &r.data.hf_id
    {
        m.insert("datasets".into(), json!([id]));
    }
    let receipt = r.receipt.output.as_deref().unwrap_or(DEFAULT_RECEIPT_FILE);
    m.insert(
        OWN_KEY.into(),
        json!({
            "project": r.meta.project,
            "run_name": r.meta.run_name,
            "description": r.meta.description,
            "method": method,
            "base": f.base.map_or_else(|| "weights not recorded beside the checkpoint".into(), BaseRecord::describe),
            "eval": f.eval.map(eval_summary),
            "receipt": receipt,
            "merged": false,
        }),
    );
    m
}

/// The hub id of a base found in the hub cache, or the one the recipe names when the run started
/// from the recipe's own `model.path`; else the directory it started from; nothing for random
/// weights.
fn base_model(recipe: &Recipe, recipe_dir: &Path, record: &BaseRecord) -> Option<String> {
    if let BaseRecord::Weights { hub: Some(hub), .. } = record {
        return Some(hub.repo.clone());
    }
    let path = record.path()?;
    let named = base::base_dir(recipe, recipe_dir, None).ok().flatten().map(|d| base::absolute(&d.dir));
    Some(if named.as_deref() == Some(path) { recipe.model.name.clone() } else { path.display().to_string() })
}

fn eval_summary(e: &EvalReport) -> Value {
    let reward_mean = e.rewards.as_ref().and_then(|r| r.get("mean")).cloned();
    let mut summary = json!({
        "step": e.step,
        "holdout_examples": e.holdout_examples,
        "loss": e.loss,
        "perplexity": e.perplexity,
        "exact_match_correct": e.exact_match_correct,
        "exact_match_total": e.exact_match_total,
        "reward_mean": reward_mean,
    });
    if let Some(tasks) = &e.tasks {
        summary["tasks"] = json!(tasks.scores);
    }
    summary
}

/// Front matter, one `key: JSON` line each, then the body.
fn render(map: &Map<String, Value>) -> String {
    let mut out = format!("{FENCE}\n");
    for (key, value) in map {
        out.push_str(&format!("{key}: {}\n", flow(value)));
    }
    out.push_str(&format!("{FENCE}\n\n"));
    out.push_str(&body(map));
    out
}

/// A JSON value on one line with a space after every `:` and `,`: JSON, and YAML flow style
/// that YAML 1.1 readers (PyYAML) take too. Floats are written without an exponent, which
/// YAML 1.1 would read as a string.
fn flow(v: &Value) -> String {
    match v {
        Value::Array(items) => format!("[{}]", items.iter().map(flow).collect::<Vec<_>>().join(", ")),
        Value::Object(m) => {
            let members: Vec<String> =
                m.iter().map(|(k, v)| format!("{}: {}", Value::from(k.as_str()), flow(v))).collect();
            format!("{{{}}}", members.join(", "))
        }
        Value::Number(n) => match n.as_f64() {
            // Display never uses an exponent (Debug does, from 1e-5 down).
            Some(x) if n.is_f64() => format!("{x}"),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

/// The front matter of a card this module wrote.
fn parse(text: &str, shown: &str) -> Result<Map<String, Value>, CardError> {
    let foreign = |reason: String| CardError::Foreign { path: shown.to_string(), reason };
    let rest = text.strip_prefix(&format!("{FENCE}\n")).ok_or_else(|| foreign("no front matter".into()))?;
    let mut map = Map::new();
    for line in rest.lines() {
        if line == FENCE {
            return match map.get(OWN_KEY) {
                Some(Value::Object(_)) => Ok(map),
                _ => Err(foreign(format!("no `{OWN_KEY}` mapping"))),
            };
        }
        let (key, value) = line.split_once(": ").ok_or_else(|| foreign(format!("line {line:?}")))?;
        let value = serde_json::from_str(value).map_err(|e| foreign(format!("`{key}`: {e}")))?;
        map.insert(key.to_string(), value);
    }
    Err(foreign("the front matter does not end".into()))
}

fn body(map: &Map<String, Value>) -> String {
    let own = map.get(OWN_KEY).cloned().unwrap_or(Value::Null);
    let text = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
    let mut s = format!("# {} / {}\n\n", text(&own, "project"), text(&own, "run_name"));
    let description = text(&own, "description");
    if !description.is_empty() {
        s.push_str(&format!("{description}\n\n"));
    }
    let merged = own.get("merged").and_then(Value::as_bool).unwrap_or(false);
    let license = map.get("license").and_then(Value::as_str).unwrap_or_default();
    s.push_str(&format!(
        "Trained with mindxtrain: method `{}`, starting from {}. License: `{license}`.\n",
        text(&own, "method"),
        text(&own, "base")
    ));
    if merged {
        s.push_str("The run's adapter is merged into its base's weights here (`mindxtrain export --merge`).\n");
    }
    s.push_str("\n## Evaluation\n\n");
    s.push_str(&evaluation(own.get("eval").unwrap_or(&Value::Null)));
    s.push_str("\n## Use\n\n");
    s.push_str(&usage(map, merged));
    s.push_str("\n## Verify\n\n");
    s.push_str(&verification(&text(&own, "receipt"), merged));
    s
}

fn evaluation(e: &Value) -> String {
    if e.is_null() {
        return "Not evaluated (the recipe's `eval.enabled` is false, or the checkpoint is not the run's final one).\n"
            .into();
    }
    let num = |k: &str| e.get(k).and_then(Value::as_f64);
    let fixed = |k: &str| num(k).map_or_else(|| "-".to_string(), |x| format!("{x:.4}"));
    let (correct, total) = (num("exact_match_correct").unwrap_or(0.0), num("exact_match_total").unwrap_or(0.0));
    let share = if total > 0.0 { format!(" ({:.1}%)", 100.0 * correct / total) } else { String::new() };
    let mut rows = vec![
        "| metric | value |".to_string(),
        "| --- | --- |".to_string(),
        format!("| held-out loss | {} |", fixed("loss")),
        format!("| perplexity | {} |", fixed("perplexity")),
        format!("| exact match | {correct}/{total}{share} |"),
    ];
    if num("reward_mean").is_some() {
        rows.push(format!("| mean reward | {} |", fixed("reward_mean")));
    }
    format!(
        "{}\n\nAt step {} on {} held-out examples (the run's `eval.json`).\n",
        rows.join("\n"),
        e.get("step").unwrap_or(&Value::Null),
        e.get("holdout_examples").unwrap_or(&Value::Null)
    )
}

fn usage(map: &Map<String, Value>, merged: bool) -> String {
    let peft = map.get("library_name").and_then(Value::as_str) == Some("peft") && !merged;
    let code = if peft {
        "from peft import AutoPeftModelForCausalLM\nfrom transformers import AutoTokenizer\n\n\
         model = AutoPeftModelForCausalLM.from_pretrained(\"DIR\")  # loads the base named in adapter_config.json\n\
         tokenizer = AutoTokenizer.from_pretrained(\"DIR\")"
    } else {
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n\n\
         model = AutoModelForCausalLM.from_pretrained(\"DIR\")\ntokenizer = AutoTokenizer.from_pretrained(\"DIR\")"
    };
    format!(
        "```python\n{code}\n```\n\nThe tokenizer files beside the weights carry the chat template the run trained with.\n"
    )
}

fn verification(receipt: &str, merged: bool) -> String {
    // `receipt.output` is relative to the run directory, or absolute.
    let at = if Path::new(receipt).is_absolute() { receipt.to_string() } else { format!("RUN/{receipt}") };
    let scope = if merged {
        "These merged weights are derived from the run's `final/` adapter: the run's manifest covers that \
         adapter (and this card's original), not the merged files. Verify the run's directory:"
    } else {
        "Every file of this directory (this card too) is a subject of the run's signed manifest (an in-toto \
         statement with SLSA provenance, in a DSSE envelope signed by the node that trained it). Its receipt \
         bundle, `{at}` (`receipt.output`), carries the manifest with the proof that the node's \
         event log records it. Verify without the node:"
    };
    format!(
        "{}\n\n```sh\nmindxtrain receipt verify {at} --files RUN --config RECIPE.yaml --plan RUN/plan.json\n\
         python3 tests/python/verify_receipt.py {at} --files RUN   # the independent verifier\n```\n\n\
         `RUN` is the run's directory (the parent of `final/`). After `mindxtrain anchor`, `mindxtrain receipt \
         export RUN` gives the bundle with its on-chain batch proof.\n",
        scope.replace("{at}", &at)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recipe::Recipe;

    const LORA: &str = include_str!("../../../recipes/tiny_cpu_lora.yaml");

    fn recipe(extra: &str) -> Recipe {
        Recipe::from_str(&format!("{LORA}\n{extra}"), "tiny_cpu_lora.yaml").unwrap().recipe
    }

    fn eval() -> EvalReport {
        serde_json::from_value(json!({
            "v": 1, "step": 40, "holdout_examples": 12, "loss": 1.5, "perplexity": 4.4817, "target_tokens": 300,
            "exact_match_total": 8, "exact_match_correct": 6, "exact_match": 0.75, "samples": []
        }))
        .unwrap()
    }

    #[test]
    fn the_card_names_the_license_base_library_and_eval_and_reads_back() {
        let mut r = recipe("");
        r.meta.license = "mit".into();
        r.meta.description = "A \"quoted\" description: with a colon".into();
        let base = BaseRecord::Weights { path: "/models/base".into(), files: vec![], hub: None };
        let report = eval();
        let facts =
            CardFacts { recipe: &r, recipe_dir: Path::new("."), base: Some(&base), adapter: true, eval: Some(&report) };
        let card = model_card(&facts);
        assert!(card.starts_with("---\n") && card.contains("\nlicense: \"mit\"\n"), "{card}");
        assert!(card.contains("base_model: \"/models/base\"\n"), "{card}");
        assert!(card.contains("library_name: \"peft\"\n"), "{card}");
        assert!(card.contains("| exact match | 6/8 (75.0%) |"), "{card}");
        assert!(card.contains("A \"quoted\" description: with a colon"), "{card}");
        let map = parse(&card, "README.md").unwrap();
        assert_eq!(map["mindxtrain"]["eval"]["loss"], 1.5);
        assert_eq!(map["tags"], json!(["mindxtrain", "lora", "qwen3"]));

        let merged = merged_card(Some(&card), &facts, "README.md").unwrap();
        assert!(merged.contains("library_name: \"transformers\"\n") && merged.contains("is merged into"), "{merged}");
        assert!(merged.contains("| exact match | 6/8 (75.0%) |"), "the run's eval is carried: {merged}");
        assert!(matches!(merged_card(Some("# hand-written\n"), &facts, "x"), Err(CardError::Foreign { .. })));
    }

    #[test]
    fn a_hub_base_and_dataset_are_named_by_their_ids() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("weights")).unwrap();
        let mut r = recipe("");
        r.model.name = "Qwen/Qwen3-0.6B".into();
        r.model.path = Some("weights".into());
        r.data.source = DataSource::Hf;
        r.data.hf_id = Some("org/data".into());
        let path = base::absolute(&dir.path().join("weights")).display().to_string();
        let base = BaseRecord::Weights { path, files: vec![], hub: None };
        let facts = CardFacts { recipe: &r, recipe_dir: dir.path(), base: Some(&base), adapter: false, eval: None };
        let card = model_card(&facts);
        assert!(card.contains("base_model: \"Qwen/Qwen3-0.6B\"\n"), "{card}");
        assert!(card.contains("datasets: [\"org/data\"]\n"), "{card}");
        assert!(card.contains("library_name: \"transformers\"\n") && card.contains("Not evaluated"), "{card}");
        assert!(card.contains("receipt verify RUN/receipt.json --files RUN"), "{card}");
        let mut placed = r.clone();
        placed.receipt.output = Some("/srv/receipts/r.json".into());
        let card = model_card(&CardFacts { recipe: &placed, ..facts });
        assert!(card.contains("receipt verify /srv/receipts/r.json --files RUN"), "{card}");
        // A base found in the hub cache is named by its repository, wherever the cache lies.
        let hub =
            crate::hub::HubSource { repo: "Qwen/Qwen3-8B".into(), revision: "main".into(), commit: "c".repeat(40) };
        let cached = BaseRecord::Weights { path: "/cache/snapshots/c".into(), files: vec![], hub: Some(hub) };
        let card = model_card(&CardFacts { base: Some(&cached), ..facts });
        assert!(card.contains("base_model: \"Qwen/Qwen3-8B\"\n"), "{card}");
        let random = BaseRecord::RandomInit { seed: 3 };
        let card = model_card(&CardFacts { base: Some(&random), ..facts });
        assert!(!card.contains("base_model:"), "no base to name: {card}");
    }

    #[test]
    fn floats_are_written_without_an_exponent() {
        assert_eq!(flow(&json!(1e-7)), "0.0000001");
        assert_eq!(flow(&json!({"a": [1, 0.5, "x"]})), "{\"a\": [1, 0.5, \"x\"]}");
    }
}
